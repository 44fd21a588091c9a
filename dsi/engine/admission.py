"""What the engine checks before it admits a request: prompt, cached prefix, imported state.

Each check raises InvalidRequest naming the problem, before anything in the engine changes.
"""

from __future__ import annotations

import torch

from dsi.engine.params import SamplingParams
from dsi.engine.prefix import CachedPrefix, ring_snapshot_shape
from dsi.engine.transfer import RequestState, StateLayout
from dsi.errors import InvalidRequest
from dsi.kvcache.layout import page_elems
from dsi.model.config import ModelConfig
from dsi.model.reference import consumer_start, exact_hit_limit, max_hit


def check_prompt(cfg: ModelConfig, num_blocks: int, prompt: list[int], params: SamplingParams) -> None:
    if not prompt:
        raise InvalidRequest("the prompt is empty")
    vocab = cfg.vocab_size
    if any(not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab for t in prompt):
        raise InvalidRequest(f"prompt token ids must be integers in [0, {vocab})")
    if len(prompt) >= cfg.max_context:
        raise InvalidRequest(f"the prompt has {len(prompt)} tokens; the context limit is {cfg.max_context}")
    if -(-len(prompt) // cfg.block_size) > num_blocks - 1:
        raise InvalidRequest("the prompt does not fit in this engine's KV cache")
    params.validate(vocab)


def check_cached(
    cfg: ModelConfig, num_blocks: int, cached: CachedPrefix, prompt_len: int, keep: int | None = None
) -> None:
    """A hit covers whole blocks, leaves the last prompt token to compute, and has pages
    ``float32 [H / block_size, page_elems]``; an exact hit (rings) also needs
    ``H <= exact_hit_limit`` and rings ``float32 [n_producer, 2, block_size, n_kv_heads, D]``."""
    h, bs, pages, elems = cached.num_tokens, cfg.block_size, cached.pages, page_elems(cfg)
    if cached.rings is not None and not cfg.ring:
        raise InvalidRequest(f"the {cfg.family} family has no SWA rings: a hit is its pages alone")
    if not isinstance(h, int) or h < 0 or h % bs:
        raise InvalidRequest(f"a cached prefix covers whole {bs}-token blocks, not {h!r} tokens")
    if h > max_hit(prompt_len, bs):
        raise InvalidRequest(
            f"a cached prefix of {h} tokens leaves no prompt token to compute (prompt of {prompt_len})"
        )
    if h // bs > num_blocks - 1:
        raise InvalidRequest("the cached prefix does not fit in this engine's KV cache")
    if (
        not isinstance(pages, torch.Tensor)
        or pages.dtype != torch.float32
        or tuple(pages.shape) != (h // bs, elems)
    ):
        shape = tuple(pages.shape) if isinstance(pages, torch.Tensor) else type(pages).__name__
        raise InvalidRequest(f"cached pages must be float32 [{h // bs}, {elems}], got {shape}")
    if cached.rings is not None:
        _check_rings(cfg, cached, prompt_len, keep)


def check_state(cfg: ModelConfig, state: RequestState, held: int = 0) -> None:
    """Buffers of this model's shape (fp32), and a cached prefix that lies inside the pages
    (``held``: pages already in place before ``state.pages``, see ``Leases.write``)."""
    n = state.pages.shape[0] if state.pages.dim() == 2 else 0
    m = state.images.shape[0] if state.images is not None and state.images.dim() == 2 else 0
    if state.layout() != StateLayout.of(cfg, n, m):
        raise InvalidRequest("imported buffers do not match this engine's model shape")
    bs = cfg.block_size
    if held < 0 or (held + n) * bs < state.num_computed:
        raise InvalidRequest("the imported state's pages do not cover its computed positions")
    if (
        state.num_cached % bs
        or state.num_cached // bs > held + n
        or not 0 <= state.replay_start <= state.num_cached
    ):
        raise InvalidRequest("the imported state's cached prefix does not match its pages")


def _check_rings(cfg: ModelConfig, cached: CachedPrefix, prompt_len: int, keep: int | None) -> None:
    h, rings = cached.num_tokens, cached.rings
    shape = ring_snapshot_shape(cfg)
    if not isinstance(rings, torch.Tensor) or rings.dtype != torch.float32 or tuple(rings.shape) != shape:
        got = tuple(rings.shape) if isinstance(rings, torch.Tensor) else type(rings).__name__
        raise InvalidRequest(f"cached rings must be float32 {list(shape)}, got {got}")
    if h == 0:
        raise InvalidRequest("cached rings need a hit of at least one block")
    if not cfg.window - 1 <= cfg.snapshot_tokens <= cfg.window:
        raise InvalidRequest("exact hits need ring snapshots of window - 1 or window positions")
    if h > exact_hit_limit(prompt_len, keep, cfg.block_size):
        raise InvalidRequest(
            f"an exact hit (cached rings) of {h} tokens needs H <= consumer_start "
            f"{consumer_start(prompt_len, keep)} (prompt of {prompt_len}); "
            f"use the hit without rings (bounded replay)"
        )
