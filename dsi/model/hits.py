"""Which prompt positions a request computes, with and without a prefix hit: integer arithmetic
only (no torch), shared by the reference forward, the engine, the prefill role and the gateway.

    position     0 ............ R ............ H ............ consumer_start ........ T
    with a hit   cached latents ...............| computed
                 producer replay from R (rebuilds the SWA rings of the window before H)

``dsi.model.reference`` defines what these numbers mean for the model's output. A family with
no consumer half (Gemma 3, ``dsi.model.gemma3_reference``) has ``keep = 0``: consumer_start is
the prompt's end, so R = max(0, H - window) and an exact hit may end at any usable boundary.
"""

from __future__ import annotations


def consumer_start(prompt_len: int, keep: int | None) -> int:
    """The first position consumer layers run on (decoder-side bounded replay; 0 when off)."""
    return 0 if keep is None else max(0, prompt_len - keep)


def replay_start(hit: int, consumer_start: int, window: int) -> int:
    """R: the first position a request with a prefix hit of ``hit`` tokens computes (0 without a hit)."""
    return 0 if hit == 0 else max(0, min(hit - window, consumer_start))


def max_hit(prompt_len: int, block_size: int) -> int:
    """The longest usable hit: whole blocks, leaving at least the last prompt token to compute."""
    return max(0, (prompt_len - 1) // block_size * block_size)


def exact_hit_limit(prompt_len: int, keep: int | None, block_size: int) -> int:
    """The longest hit that can be exact (loaded SWA rings, no replay): whole blocks, at most
    :func:`max_hit`, and not past ``consumer_start`` (0 when decoder-side replay is off)."""
    return min(max_hit(prompt_len, block_size), consumer_start(prompt_len, keep) // block_size * block_size)
