"""Instances that share one host's cores: processor sharing, and the clock each instance runs on.

A hardware profile gives an instance's speed with a host to itself (``threads`` compute threads,
as ``dsi bench engine`` measured it). When the engines of a one-host cluster (``dsi serve`` on
a machine: every prefill and decode on the same cores) compute at once, they share the cores::

    pace(k) = max(1, k * threads / cores)      wall seconds per second of work, k busy instances

and every busy instance runs at that pace until k changes (processor sharing). An instance keeps
its work in its own clock (:class:`WorkClock`): seconds of work as the profile prices them, the
wall time they end at moving whenever the pace does. With ``cores`` = 0 (the default: each
instance on a device of its own) the pace is always 1.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class HostShare:
    """``cores`` of the host (0: no sharing); ``threads`` each busy instance computes with."""

    cores: float = 0.0
    threads: float = 1.0

    def __post_init__(self) -> None:
        if self.cores < 0 or self.threads <= 0:
            raise ValueError(f"host share needs cores >= 0 and threads > 0, got {self}")

    @property
    def shared(self) -> bool:
        return self.cores > 0

    def pace(self, busy: int) -> float:
        """Wall seconds per second of work while ``busy`` instances compute (>= 1)."""
        if not self.shared or busy <= 0:
            return 1.0
        return max(1.0, busy * self.threads / self.cores)


@dataclass(slots=True)
class WorkClock:
    """One instance's work time against wall time: ``pace`` wall seconds per work second since
    the anchor (``wall0``, ``work0``). Piecewise linear and increasing, so both ways are exact."""

    pace: float = 1.0
    wall0: float = 0.0
    work0: float = 0.0

    def work(self, wall: float) -> float:
        return self.work0 + (wall - self.wall0) / self.pace

    def wall(self, work: float) -> float:
        return self.wall0 + (work - self.work0) * self.pace

    def set_pace(self, now: float, pace: float) -> None:
        """From wall time ``now`` on, run at ``pace``."""
        self.work0, self.wall0, self.pace = self.work(now), now, pace
