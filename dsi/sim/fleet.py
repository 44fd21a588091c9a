"""The instances of one role over time, and the autoscaler's moves applied to them.

The policy decides on counts (``dsi.autoscale.simulate.SimRole``: serving, ready, the times
starting ones become ready); the fleet keeps the instances behind the counts and moves the same
number of them as the controller's scaler does (``dsi.roles.controller.scaling``)::

    take k          the lowest-id ready instances serve (idle ones before ones still draining)
    return k        the least busy serving instances (ties: the highest id) leave service, finish
                    what they hold, and wait in the ready pool
    stop serving k  the next least busy serving ones leave service, finish, and stop
    stop ready k    the highest-id ready instances stop (once they hold nothing)
    start k         new instances become ready ``start_s`` later (at the next decision after)

Leaving service is instant for routing and the counts; the work an instance holds then runs to
its end (dsi's drain would migrate decode requests after a 1-minute grace period). An
instance counts from its start until it stops: ``held`` seconds, of which ``busy`` computing
(a prefill forward, decode steps of a non-empty batch), ``used`` the busy seconds weighted by
the share of the instance the work takes (a prefill: all of it; a decode step: batch /
max_requests) and ``serving`` in service; idle = held - used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from dsi.autoscale.config import RoleBounds
from dsi.autoscale.decision import RoleDecision
from dsi.autoscale.inputs import RoleInputs
from dsi.autoscale.simulate import SimRole
from dsi.sim.decode import DecodeInstance
from dsi.sim.prefill import PrefillInstance

Engine = PrefillInstance | DecodeInstance


@dataclass(slots=True)
class Member:
    engine: Engine
    state: str  # starting | ready | serving | returning | stopping | gone
    born_s: float
    ready_at_s: float
    gone_s: float | None = None
    serving_s: float = 0.0
    since_s: float = 0.0  # when it last entered service

    @property
    def id(self) -> str:
        return self.engine.id


@dataclass(slots=True)
class Fleet:
    """``prefix``: instance ids are prefix + a 4-digit number; ``make(id)``: a new engine."""

    prefix: str
    make: Callable[[str], Engine]
    counts: SimRole
    members: list[Member] = field(default_factory=list)
    _next: int = 0

    @classmethod
    def fixed(cls, prefix: str, make: Callable[[str], Engine], serving: int) -> Fleet:
        fleet = cls(prefix, make, SimRole(serving, 0))
        fleet._add(serving, "serving", 0.0, 0.0)
        return fleet

    @classmethod
    def scaled(cls, prefix: str, make: Callable[[str], Engine], bounds: RoleBounds) -> Fleet:
        counts = SimRole.initial(bounds)
        fleet = cls(prefix, make, counts)
        fleet._add(counts.serving, "serving", 0.0, 0.0)
        fleet._add(counts.ready, "ready", 0.0, 0.0)
        return fleet

    def serving(self) -> list[Member]:
        return [m for m in self.members if m.state == "serving"]

    def arrive(self, now: float) -> None:
        """Started instances whose delay has passed join the ready pool."""
        self.counts = self.counts.arrive(now)
        for m in self.members:
            if m.state == "starting" and m.ready_at_s <= now:
                m.state = "ready"

    def inputs(self, capacity: float, demand: float) -> RoleInputs:
        return self.counts.inputs(capacity, demand)

    def apply(self, decision: RoleDecision, now: float, start_s: float) -> None:
        self.counts = self.counts.apply(decision, now + start_s)
        ready = sorted(
            (m for m in self.members if m.state in ("ready", "returning")),
            key=lambda m: (m.state == "returning", m.id),
        )
        for m in ready[: decision.take_from_pool]:
            self._serve(m, now)
        serving = sorted(self.serving(), key=lambda m: (_held(m, now), _desc(m.id)))
        leaving = serving[: decision.return_to_pool + decision.stop_serving]
        for m in leaving[: decision.return_to_pool]:
            self._leave(m, "returning", now)
        for m in leaving[decision.return_to_pool :]:
            self._leave(m, "stopping", now)
        ready = sorted((m for m in self.members if m.state in ("ready", "returning")), key=lambda m: m.id)
        for m in list(reversed(ready))[: decision.stop_ready]:
            m.state = "stopping"
        self._add(decision.start, "starting", now, now + start_s)
        self.settle(now)

    def settle(self, now: float) -> None:
        """Instances out of service that hold nothing more: back in the pool, or stopped."""
        for m in self.members:
            if m.state in ("returning", "stopping") and m.engine.idle:
                if m.state == "returning":
                    m.state = "ready"
                else:
                    m.state, m.gone_s = "gone", now

    def census(self) -> tuple[int, int, int]:
        """(serving, ready, starting) as the policy counts them."""
        return self.counts.serving, self.counts.ready, len(self.counts.ready_at_s)

    def hours(self, end_s: float) -> dict[str, float]:
        """Instance-hours until ``end_s``: held, busy, used, serving, idle (held - used)."""
        held = sum((m.gone_s if m.gone_s is not None else end_s) - m.born_s for m in self.members)
        busy = sum(m.engine.busy_s for m in self.members)
        used = sum(m.engine.used_s for m in self.members)
        serving = sum(
            m.serving_s + (end_s - m.since_s if m.state == "serving" else 0.0) for m in self.members
        )
        return {
            "instance_hours": round(held / 3600, 4),
            "busy_hours": round(busy / 3600, 4),
            "used_hours": round(used / 3600, 4),
            "serving_hours": round(serving / 3600, 4),
            "idle_hours": round((held - used) / 3600, 4),
        }

    def _add(self, count: int, state: str, now: float, ready_at: float) -> None:
        for _ in range(count):
            engine = self.make(f"{self.prefix}{self._next:04d}")
            self._next += 1
            member = Member(engine, state, now, ready_at, since_s=now)
            self.members.append(member)

    def _serve(self, m: Member, now: float) -> None:
        m.state, m.since_s = "serving", now

    def _leave(self, m: Member, state: str, now: float) -> None:
        m.serving_s += now - m.since_s
        m.state = state


def _held(m: Member, now: float) -> int:
    return m.engine.load(now).running_requests


def _desc(text: str) -> tuple[int, ...]:
    return tuple(-ord(c) for c in text)
