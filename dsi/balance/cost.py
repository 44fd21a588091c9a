"""What a prefill costs: the model's FLOP estimate for computing the un-cached tokens of a prompt
whose first ``cached`` tokens come from the store (``dsi.model.flops``).

On the ``flash`` shape the estimate is nearly linear in the un-cached tokens: the indexer keeps
512 global entries per query, so only its 32-wide scoring grows with the context (about 14.4
GFLOP per token at 16K, 14.6 at 1M)::

    >>> cost = PrefillCost()
    >>> round(cost(16_384) / 1e12, 1), round(cost(4_096, cached=65_536) / 1e12, 1)
    (235.8, 62.5)
"""

from __future__ import annotations

from dataclasses import dataclass

from dsi.model.config import FLASH, ModelConfig
from dsi.model.flops import prefill_flops


@dataclass(slots=True, frozen=True)
class PrefillCost:
    """FLOPs of one prefill on ``model`` with decoder-side bounded replay (``model.keep``)."""

    model: ModelConfig = FLASH

    def __call__(self, uncached: int, cached: int = 0) -> float:
        """FLOPs of computing ``uncached`` tokens (>= 1) after a prefix hit of ``cached`` tokens."""
        if uncached < 1 or cached < 0:
            raise ValueError(
                f"a prefill computes >= 1 token after >= 0 cached ones, not {uncached} / {cached}"
            )
        return prefill_flops(self.model, uncached + cached, self.model.keep, hit=cached).total
