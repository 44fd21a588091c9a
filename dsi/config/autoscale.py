"""[autoscale]: how the controller scales prefill and decode (see dsi.autoscale for the policy).

    [autoscale]                      AutoscaleSection(interval_s=30.0, quota_threshold=0.8,
    interval_s = 30.0          -->                    drain_timeout_s=60.0,
    [autoscale.decode]                                decode=AutoscaleRole(min_instances=1, ...),
    min_instances = 1                                 prefill=None)
    max_instances = 3
    capacity = 16.0

A role without its table is not scaled: every instance of it serves as soon as it is ready and
nothing is started or stopped for it. Without an [autoscale] section nothing is scaled at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dsi.autoscale import AutoscalerConfig, RoleBounds
from dsi.autoscale.config import SCALED_ROLES, ScaledRole
from dsi.config.errors import ConfigError
from dsi.config.spec import Check, Seen, at_least, at_most, greater, rule, spec


def _at_least_key(name: str) -> Check:
    @rule(f">= {name}")
    def check(value: Any, seen: Seen) -> str | None:
        return None if value >= seen[name] else f"must be >= {name} ({seen[name]}), got {value}"

    return check


def _at_most_key(name: str) -> Check:
    @rule(f"<= {name}")
    def check(value: Any, seen: Seen) -> str | None:
        return None if value <= seen[name] else f"must be <= {name} ({seen[name]}), got {value}"

    return check


def _absent(_: Seen) -> None:
    return None


@dataclass(slots=True, frozen=True, kw_only=True)
class AutoscaleRole:
    """[autoscale.prefill] or [autoscale.decode]: the bounds of one scaled role."""

    min_instances: int = field(
        default=1, metadata=spec(doc="The fewest serving instances.", checks=(at_least(0),))
    )
    max_instances: int = field(
        metadata=spec(
            doc="The most serving instances, and the role's quota (serving + ready + starting).",
            checks=(at_least(1), _at_least_key("min_instances")),
        )
    )
    max_change: int = field(
        default=1,
        metadata=spec(doc="The largest change of the serving count per interval.", checks=(at_least(1),)),
    )
    margin: float = field(
        default=0.2,
        metadata=spec(
            doc="Serving capacity must exceed demand * (1 + margin).", checks=(at_least(0.0), at_most(10.0))
        ),
    )
    ready_pool: int = field(
        default=0,
        metadata=spec(
            doc="Started but unassigned instances to keep.",
            checks=(at_least(0), _at_most_key("max_instances")),
        ),
    )
    capacity: float = field(
        metadata=spec(
            doc="What one serving instance sustains: un-cached prompt tokens/s for prefill, active "
            "requests for decode.",
            checks=(greater(0.0),),
        )
    )

    def bounds(self) -> RoleBounds:
        return RoleBounds(
            min_instances=self.min_instances,
            max_instances=self.max_instances,
            max_change=self.max_change,
            margin=self.margin,
            ready_pool=self.ready_pool,
        )

    @property
    def initial(self) -> int:
        """Instances to start with: min_instances serving plus the ready pool, within the quota."""
        return min(self.min_instances + self.ready_pool, self.max_instances)


# The bounds the policy is given for a role that is not scaled; its decisions are ignored.
_UNSCALED = RoleBounds(min_instances=0, max_instances=1, ready_pool=0)


@dataclass(slots=True, frozen=True, kw_only=True)
class AutoscaleSection:
    """[autoscale]: how the controller scales prefill and decode. Without the section nothing is
    scaled; a role without its table is not scaled."""

    interval_s: float = field(
        default=30.0,
        metadata=spec(doc="Seconds between two scaling decisions.", checks=(greater(0.0), at_most(3600.0))),
    )
    quota_threshold: float = field(
        default=0.8,
        metadata=spec(
            doc="No scale-down while serving / max_instances is above this.",
            checks=(greater(0.0), at_most(1.0)),
        ),
    )
    drain_timeout_s: float = field(
        default=60.0,
        metadata=spec(
            doc="Seconds an instance taken out of service may finish its running requests before it "
            "is stopped anyway.",
            checks=(greater(0.0),),
        ),
    )
    prefill: AutoscaleRole | None = field(default=None, metadata=spec(fallback=_absent))
    decode: AutoscaleRole | None = field(default=None, metadata=spec(fallback=_absent))

    def role(self, name: ScaledRole) -> AutoscaleRole | None:
        return self.prefill if name == "prefill" else self.decode

    def scaled(self) -> Mapping[ScaledRole, AutoscaleRole]:
        """The roles that have a table, by name."""
        return {name: role for name in SCALED_ROLES if (role := self.role(name)) is not None}

    def policy(self) -> AutoscalerConfig:
        """The policy's config; a role without a table gets bounds whose decisions are ignored."""
        bounds = {
            name: (role.bounds() if role else _UNSCALED)
            for name in SCALED_ROLES
            for role in (self.role(name),)
        }
        return AutoscalerConfig(interval_s=self.interval_s, quota_threshold=self.quota_threshold, **bounds)


def check_declared(section: AutoscaleSection, declared: Mapping[str, int], file: str) -> None:
    """ConfigError unless each scaled role declares at least ``max_instances`` [[roles]] of its
    kind (``declared``: count by kind), so that whoever starts instances has one to start."""
    for name, role in section.scaled().items():
        if declared.get(name, 0) < role.max_instances:
            raise ConfigError(
                file,
                f"autoscale.{name}.max_instances",
                f"{role.max_instances} {name} instances may run, but the config declares "
                f"{declared.get(name, 0)} [[roles]] of kind {name!r}",
            )
