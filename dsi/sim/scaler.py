"""The autoscaler in the loop: demand measured as the controller measures it, the real decision
(``dsi.autoscale.decide``) every ``interval_s``, its moves applied to the fleets.

    prefill demand    un-cached prompt tokens routed since the last decision / seconds since it
    prefill capacity  ``SimConfig.prefill_capacity``, else CostModel.prefill_tokens_per_s()
    decode demand     the most requests held by decodes or waiting for one, since the last
                      decision (the controller samples it every heartbeat)
    decode capacity   ``SimConfig.decode_capacity``, else the largest batch whose step, with
                      ``SLO_KV_TOKENS`` of KV per request, stays within the TBT SLO
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dsi.autoscale import AutoscalerConfig, Decision, decide
from dsi.autoscale.inputs import ScalingInputs
from dsi.sim.fleet import Fleet
from dsi.sim.step_time import StepTimeModel

SLO_KV_TOKENS = 16_384


def slo_batch(
    model: StepTimeModel, tbt_s: float, max_requests: int, kv_per_request: int = SLO_KV_TOKENS
) -> int:
    """The largest batch (1..max_requests) whose step takes at most ``tbt_s``."""
    best = 1
    for batch in range(1, max_requests + 1):
        if model.step_s(batch, batch * kv_per_request) > tbt_s:
            break
        best = batch
    return best


@dataclass(slots=True)
class SimScaler:
    config: AutoscalerConfig
    prefill_capacity: float  # un-cached tokens/s per instance
    decode_capacity: float  # active requests per instance
    start_s: float
    last: Decision | None = None
    moves: dict[str, int] = field(default_factory=dict)  # "role action" -> instances moved
    _last_s: float | None = None

    def due(self, now: float) -> bool:
        return self._last_s is None or now - self._last_s >= self.config.interval_s * 0.99

    def decide(self, now: float, prefills: Fleet, decodes: Fleet, uncached: int, active_peak: int) -> None:
        """One decision from the tokens routed and the peak of active requests since the last."""
        elapsed = now - self._last_s if self._last_s is not None else 0.0
        prefills.arrive(now)
        decodes.arrive(now)
        inputs = ScalingInputs(
            now_s=now,
            prefill=prefills.inputs(self.prefill_capacity, uncached / elapsed if elapsed > 0 else 0.0),
            decode=decodes.inputs(self.decode_capacity, float(active_peak)),
        )
        self.last = decide(self.config, inputs, self.last)
        self._last_s = now
        prefills.apply(self.last.prefill, now, self.start_s)
        decodes.apply(self.last.decode, now, self.start_s)
        for role in ("prefill", "decode"):
            got = self.last.role(role)  # type: ignore[arg-type]
            for action, count in (
                ("take", got.take_from_pool),
                ("return", got.return_to_pool),
                ("stop_serving", got.stop_serving),
                ("stop_ready", got.stop_ready),
                ("start", got.start),
            ):
                key = f"{role} {action}"
                self.moves[key] = self.moves.get(key, 0) + count
