"""What the autoscaler sees at one decision: instance counts, measured capacity and demand per role."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dsi.autoscale.config import SCALED_ROLES, ScaledRole, check_role


@dataclass(slots=True, frozen=True, kw_only=True)
class RoleInputs:
    """One role's state at a decision.

    Counts of instances: ``serving`` are online and assigned (they take requests), ``ready`` are
    started but unassigned (the ready pool), ``starting`` were launched and are not ready yet.

    ``capacity`` and ``demand`` are in the role's own unit:

    ========  ======================================  ==================================
    role      capacity (per serving instance)         demand (whole role)
    ========  ======================================  ==================================
    prefill   un-cached prompt tokens/s it sustains   un-cached prompt tokens/s arriving
    decode    active requests it holds                active requests
    ========  ======================================  ==================================

    ``capacity`` must be positive: with no instance to measure, pass the last measurement or a
    configured estimate.

    ``manual`` is an operator's serving target (``dsi scale``), which replaces what demand asks
    for; None leaves the target to demand.
    """

    serving: int
    ready: int = 0
    starting: int = 0
    capacity: float
    demand: float
    manual: int | None = None

    def __post_init__(self) -> None:
        for name in ("serving", "ready", "starting"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        if self.manual is not None and (
            not isinstance(self.manual, int) or isinstance(self.manual, bool) or self.manual < 0
        ):
            raise ValueError(f"manual must be a non-negative integer or None, got {self.manual!r}")
        if not (_is_finite(self.capacity) and self.capacity > 0):
            raise ValueError(f"capacity must be a positive finite number, got {self.capacity!r}")
        if not (_is_finite(self.demand) and self.demand >= 0):
            raise ValueError(f"demand must be a non-negative finite number, got {self.demand!r}")

    @property
    def held(self) -> int:
        """Instances that count against the role's quota: serving + ready + starting."""
        return self.serving + self.ready + self.starting


@dataclass(slots=True, frozen=True, kw_only=True)
class ScalingInputs:
    """Both roles at time ``now_s`` (seconds on a monotonic clock; only differences matter)."""

    now_s: float
    prefill: RoleInputs
    decode: RoleInputs

    def __post_init__(self) -> None:
        if not _is_finite(self.now_s):
            raise ValueError(f"now_s must be a finite number of seconds, got {self.now_s!r}")
        for name in SCALED_ROLES:
            if not isinstance(getattr(self, name), RoleInputs):
                raise ValueError(f"{name} must be a RoleInputs, got {type(getattr(self, name)).__name__}")

    def role(self, name: ScaledRole) -> RoleInputs:
        return self.prefill if check_role(name) == "prefill" else self.decode


def _is_finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
