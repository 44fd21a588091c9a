"""What one engine step computes: a slice of tokens per sequence, and the cache they use."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from dsi.engine.hit_load import HitLoad


@dataclass(slots=True)
class StepSlice:
    """One sequence's share of a step.

    Positions ``[start, start + len(tokens))`` are computed; earlier positions are in the cache
    (pages of ``block_table`` and state slot ``slot``). Consumer layers skip positions below
    ``consumer_start`` (decoder-side bounded replay). ``sample`` asks for the logits of the
    last position. With a prefix hit, producer SWA keys start at ``producer_start`` (R) and the
    page entries of positions below ``cached_end`` (H) hold loaded latents that are never written.
    ``embeds``: (row within the slice, [n, hidden] rows) of image embeddings that replace the
    token embeddings of those positions (see dsi.engine.images).
    ``num_logits`` (with ``sample``): how many trailing positions' logits are wanted, more than
    one for a speculative verify slice (its last token and its drafts).
    ``hit_load``: the hit's pages are still being copied into ``block_table`` (layer by layer,
    :mod:`dsi.engine.hit_load`); the forward waits for a layer's part before that layer.
    """

    slot: int
    block_table: list[int]
    start: int
    tokens: list[int]
    consumer_start: int
    sample: bool
    producer_start: int = 0
    cached_end: int = 0
    embeds: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    num_logits: int = 1
    hit_load: HitLoad | None = None

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)
