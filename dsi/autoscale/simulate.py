"""Step the policy over a demand time series, with instances that take a while to start.

The simulated cluster per role: serving and ready counts, and the times at which starting
instances become ready. At step i (``now = i * interval_s``) instances whose start delay has
passed join the ready pool, the policy decides, and its actions apply at once: takes, returns
and stops are instant (a real drain takes a grace period), starts become ready
``start_delay_s`` later. Each role begins at ``min_instances`` serving with its ready pool full.

:class:`SimRole` holds one role's counts between decisions (``dsi sim`` steps it too, beside
its instances). Capacity per instance is constant; ``demand_series[i]`` is (prefill un-cached
tokens/s, decode active requests) during interval i.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dsi.autoscale.config import AutoscalerConfig, RoleBounds
from dsi.autoscale.decision import Decision, RoleDecision
from dsi.autoscale.inputs import RoleInputs, ScalingInputs
from dsi.autoscale.policy import decide


@dataclass(slots=True, frozen=True)
class SimRole:
    """One role's instance counts as the policy sees them: serving, ready, and the times at which
    starting instances become ready. Shared with ``dsi sim``, which keeps instance identities
    beside these counts."""

    serving: int
    ready: int
    ready_at_s: tuple[float, ...] = ()  # one per starting instance

    @classmethod
    def initial(cls, bounds: RoleBounds) -> SimRole:
        return cls(bounds.min_instances, min(bounds.ready_pool, bounds.max_instances - bounds.min_instances))

    def arrive(self, now_s: float) -> SimRole:
        """Instances whose start delay has passed join the ready pool."""
        still = tuple(t for t in self.ready_at_s if t > now_s)
        return SimRole(self.serving, self.ready + len(self.ready_at_s) - len(still), still)

    def inputs(self, capacity: float, demand: float) -> RoleInputs:
        return RoleInputs(
            serving=self.serving,
            ready=self.ready,
            starting=len(self.ready_at_s),
            capacity=capacity,
            demand=demand,
        )

    def apply(self, decision: RoleDecision, ready_at_s: float) -> SimRole:
        serving = self.serving + decision.take_from_pool - decision.return_to_pool - decision.stop_serving
        ready = self.ready - decision.take_from_pool + decision.return_to_pool - decision.stop_ready
        return SimRole(serving, ready, self.ready_at_s + (ready_at_s,) * decision.start)


def simulate(
    config: AutoscalerConfig,
    demand_series: Sequence[tuple[float, float]],
    *,
    prefill_capacity: float,
    decode_capacity: float,
    start_delay_s: float,
) -> tuple[Decision, ...]:
    """One decision per element of ``demand_series``, made every ``config.interval_s`` seconds."""
    if not start_delay_s >= 0:
        raise ValueError(f"start_delay_s must be a non-negative number of seconds, got {start_delay_s!r}")
    prefill, decode = SimRole.initial(config.prefill), SimRole.initial(config.decode)
    decisions: list[Decision] = []
    for step, (prefill_demand, decode_demand) in enumerate(demand_series):
        now_s = step * config.interval_s
        prefill, decode = prefill.arrive(now_s), decode.arrive(now_s)
        inputs = ScalingInputs(
            now_s=now_s,
            prefill=prefill.inputs(prefill_capacity, prefill_demand),
            decode=decode.inputs(decode_capacity, decode_demand),
        )
        decision = decide(config, inputs, decisions[-1] if decisions else None)
        decisions.append(decision)
        prefill = prefill.apply(decision.prefill, now_s + start_delay_s)
        decode = decode.apply(decision.decode, now_s + start_delay_s)
    return tuple(decisions)
