"""What the autoscaler decided for one interval, with the rules that bound each role's result."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from dsi.autoscale.config import SCALED_ROLES, ScaledRole, check_role
from dsi.autoscale.inputs import ScalingInputs


class Rule(StrEnum):
    """A rule that moved a role's result away from what demand alone asked for."""

    MIN = "min"  # the need was below min_instances
    MAX = "max"  # the need was above max_instances
    MANUAL = "manual"  # an operator's target replaced the need
    QUOTA = "quota"  # quota use above the threshold: no scale-down, no stop
    COOLDOWN = "cooldown"  # the target already changed less than one interval ago
    RATE_LIMIT = "rate_limit"  # the change was more than max_change
    POOL_QUOTA = "pool_quota"  # the ready pool target was cut so the role stays within max_instances


@dataclass(slots=True, frozen=True)
class Reason:
    rule: Rule
    text: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.text}"


@dataclass(slots=True, frozen=True, kw_only=True)
class RoleDecision:
    """One role's decision. Counts are instances; actions apply in this order:

    1. ``take_from_pool`` ready instances become serving (instant);
    2. ``return_to_pool`` serving instances are drained and become ready;
    3. ``stop_serving`` serving instances are drained and stopped;
    4. ``stop_ready`` ready instances are stopped;
    5. ``start`` new instances are launched; each joins the ready pool when it is ready.

    ``target`` is the serving count wanted; ``shortfall`` = target - serving after steps 1-3,
    which instances starting now or earlier cover once they are ready. ``need`` is what demand
    alone asks for, before bounds, the quota rule and the rate limit. ``last_change_s`` is when
    the target last changed (the cooldown's memory; None if it never has).
    """

    need: int
    target: int
    take_from_pool: int = 0
    return_to_pool: int = 0
    stop_serving: int = 0
    stop_ready: int = 0
    start: int = 0
    pool_target: int = 0
    shortfall: int = 0
    last_change_s: float | None = None
    reasons: tuple[Reason, ...] = ()

    @property
    def rules(self) -> tuple[Rule, ...]:
        """The rules that bound this decision, in the order they were applied."""
        return tuple(reason.rule for reason in self.reasons)

    def describe(self) -> str:
        """One line of counts, then one indented line per reason."""
        actions = [
            f"{verb} {count}"
            for verb, count in (
                ("take", self.take_from_pool),
                ("return", self.return_to_pool),
                ("stop serving", self.stop_serving),
                ("stop ready", self.stop_ready),
                ("start", self.start),
            )
            if count
        ]
        head = (
            f"need {self.need}, target {self.target}, {', '.join(actions) or 'no action'}, "
            f"pool target {self.pool_target}, shortfall {self.shortfall}"
        )
        return "\n".join([head, *(f"  {reason}" for reason in self.reasons)])


@dataclass(slots=True, frozen=True, kw_only=True)
class Decision:
    """Both roles' decisions, with the inputs they were made from (``inputs.now_s`` is when)."""

    inputs: ScalingInputs
    prefill: RoleDecision
    decode: RoleDecision

    def role(self, name: ScaledRole) -> RoleDecision:
        return self.prefill if check_role(name) == "prefill" else self.decode

    def describe(self) -> str:
        """A human-readable summary: per role its inputs, then its decision."""
        lines = [f"at {self.inputs.now_s:g} s"]
        for name in SCALED_ROLES:
            seen = self.inputs.role(name)
            lines.append(
                f"{name}: serving {seen.serving}, ready {seen.ready}, starting {seen.starting}, "
                f"demand {seen.demand:g}, capacity {seen.capacity:g}"
            )
            lines += [f"  {line}" for line in self.role(name).describe().splitlines()]
        return "\n".join(lines)
