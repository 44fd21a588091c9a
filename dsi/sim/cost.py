"""The cost model: seconds of a prefill, a PD handoff and a decode step on one hardware profile.

    prefill_s(u, c)  = prefill_fixed_s + max(FLOPs(u, c) / prefill_flops_per_s,      compute
                                             pages(c) * page_bytes / store_bytes_per_s)  hit load
    handoff_s(p)     = (pages(p) * page_bytes + state_bytes) / transfer_bytes_per_s
    decode step      = profile.decode.step_s(batch, kv_tokens)   (dsi.sim.step_time)

FLOPs(u, c) is ``dsi.model.flops.prefill_flops`` of a prompt of u + c tokens whose first c come
from the store: the producer half replays the SWA window before the hit (bounded replay), and
with decoder-side bounded replay (``keep``) the consumer half runs on the last ``keep`` tokens
only. The hit's pages load layer by layer while the forward runs, so the two overlap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dsi.kvcache.layout import account
from dsi.model.flops import prefill_flops
from dsi.sim.profiles import HardwareProfile
from dsi.sim.step_time import StepTimeModel


@dataclass(slots=True)
class CostModel:
    """``keep``: decoder-side bounded replay (the model's keep), or None to run every layer on
    every prompt token."""

    profile: HardwareProfile
    keep: int | None
    page_bytes: float = field(init=False)
    state_bytes: float = field(init=False)
    _flops: dict[tuple[int, int], float] = field(init=False, default_factory=dict)
    _model_flops: dict[tuple[int, int], float] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        acct = account(self.profile.model)
        self.page_bytes = acct.block
        self.state_bytes = acct.state_slot

    @classmethod
    def of(cls, profile: HardwareProfile, replay: bool = True) -> CostModel:
        return cls(profile, profile.model.keep if replay else None)

    @property
    def block_size(self) -> int:
        return self.profile.model.block_size

    @property
    def decode(self) -> StepTimeModel:
        return self.profile.decode

    def prefill_flops(self, uncached: int, cached: int) -> float:
        """FLOPs of computing ``uncached`` (>= 1) tokens after a hit of ``cached`` tokens."""
        if self.keep == self.profile.model.keep:
            return self.model_flops(uncached, cached)
        return self._priced(self._flops, self.keep, uncached, cached)

    def model_flops(self, uncached: int, cached: int) -> float:
        """What the balancer prices a prefill at (``dsi.balance.PrefillCost`` of the model, whose
        keep is on whatever the engines run)."""
        return self._priced(self._model_flops, self.profile.model.keep, uncached, cached)

    def _priced(
        self, memo: dict[tuple[int, int], float], keep: int | None, uncached: int, cached: int
    ) -> float:
        flops = memo.get((uncached, cached))
        if flops is None:
            flops = memo[uncached, cached] = prefill_flops(
                self.profile.model, uncached + cached, keep, hit=cached
            ).total
        return flops

    def prefill_s(self, uncached: int, cached: int) -> float:
        compute = self.prefill_flops(uncached, cached) / self.profile.prefill_flops_per_s
        load = cached // self.block_size * self.page_bytes / self.profile.store_bytes_per_s
        return self.profile.prefill_fixed_s + max(compute, load)

    def handoff_s(self, prompt_tokens: int) -> float:
        pages = -(-prompt_tokens // self.block_size)
        return (pages * self.page_bytes + self.state_bytes) / self.profile.transfer_bytes_per_s

    def prefill_tokens_per_s(self, tokens: int = 8192) -> float:
        """Un-cached tokens/s one prefill instance sustains on ``tokens``-token prompts without a
        hit: the autoscaler's prefill capacity."""
        return tokens / self.prefill_s(tokens, 0)
