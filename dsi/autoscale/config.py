"""The autoscaler's settings: per-role bounds and the cluster-wide interval and quota rule."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

ScaledRole = Literal["prefill", "decode"]
SCALED_ROLES: tuple[ScaledRole, ...] = get_args(ScaledRole)


@dataclass(slots=True, frozen=True, kw_only=True)
class RoleBounds:
    """How one role (prefill or decode) may be scaled.

    ``min_instances`` / ``max_instances`` bound the serving count. ``max_instances`` is also the
    role's quota: serving + ready + starting instances never exceed it through a start.
    ``max_change`` is the largest change of the serving count in one interval, up or down.
    ``margin`` is a fraction (0.2 = 20 %): the serving capacity must strictly exceed
    demand * (1 + margin). A fraction rather than a count of spare instances, so the headroom
    grows with the role; the strict inequality already leaves some headroom at margin 0.
    ``ready_pool`` is how many started-but-unassigned instances to keep.
    """

    min_instances: int = 1
    max_instances: int
    max_change: int = 1
    margin: float = 0.2
    ready_pool: int = 0

    def __post_init__(self) -> None:
        _check_count("min_instances", self.min_instances, lowest=0)
        _check_count("max_instances", self.max_instances, lowest=1)
        if self.max_instances < self.min_instances:
            raise ValueError(
                f"max_instances ({self.max_instances}) is below min_instances ({self.min_instances})"
            )
        _check_count("max_change", self.max_change, lowest=1)
        _check_count("ready_pool", self.ready_pool, lowest=0)
        if self.ready_pool > self.max_instances:
            raise ValueError(f"ready_pool ({self.ready_pool}) exceeds max_instances ({self.max_instances})")
        if not (_is_number(self.margin) and math.isfinite(self.margin) and 0.0 <= self.margin <= 10.0):
            raise ValueError(f"margin must be a fraction in [0, 10], got {self.margin!r}")


@dataclass(slots=True, frozen=True, kw_only=True)
class AutoscalerConfig:
    """Bounds per role, the decision interval (seconds) and the quota-use threshold.

    While a role's quota use (serving / max_instances) is strictly above ``quota_threshold``,
    its serving count does not shrink and no instance of it is stopped (except to come back
    within ``max_instances``). At exactly the threshold, scale-down is allowed.
    """

    prefill: RoleBounds
    decode: RoleBounds
    interval_s: float = 30.0
    quota_threshold: float = 0.8

    def __post_init__(self) -> None:
        for name in SCALED_ROLES:
            if not isinstance(getattr(self, name), RoleBounds):
                raise ValueError(f"{name} must be a RoleBounds, got {type(getattr(self, name)).__name__}")
        if not (_is_number(self.interval_s) and math.isfinite(self.interval_s) and self.interval_s > 0):
            raise ValueError(f"interval_s must be a positive number of seconds, got {self.interval_s!r}")
        if not (_is_number(self.quota_threshold) and 0.0 < self.quota_threshold <= 1.0):
            raise ValueError(f"quota_threshold must be in (0, 1], got {self.quota_threshold!r}")

    def bounds(self, role: ScaledRole) -> RoleBounds:
        return self.prefill if check_role(role) == "prefill" else self.decode


def check_role(name: str) -> ScaledRole:
    """``name`` if it is a scaled role, else a ValueError naming the choices."""
    if name not in SCALED_ROLES:
        raise ValueError(f"unknown role {name!r}: expected one of {', '.join(SCALED_ROLES)}")
    return name  # type: ignore[return-value]


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_count(name: str, value: object, *, lowest: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < lowest:
        raise ValueError(f"{name} must be at least {lowest}, got {value}")
