"""What one engine step computes: a slice of tokens per sequence, and the cache they use."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class StepSlice:
    """One sequence's share of a step.

    Positions ``[start, start + len(tokens))`` are computed; earlier positions are in the cache
    (pages of ``block_table`` and state slot ``slot``). Consumer layers skip positions below
    ``consumer_start`` (decoder-side bounded replay). ``sample`` asks for the logits of the
    last position.
    """

    slot: int
    block_table: list[int]
    start: int
    tokens: list[int]
    consumer_start: int
    sample: bool

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)
