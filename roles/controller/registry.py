"""InstanceRegistry: every role instance's lifecycle state, kept from heartbeats.

Pure bookkeeping, no I/O: every method takes ``now`` (monotonic seconds) and returns the
lifecycle moves it made (:class:`Transition`), which the registry also counts; the controller
logs them. The states and allowed moves are in :mod:`dsi.roles.controller.lifecycle`.

    heartbeat (new run) --> starting | ready ---_assign()---> serving (unless the ready pool keeps it)
    the controller's own order (move) -------------------> serving | draining | ready
    process says stopping ------------------------------> draining
    SetState(draining) ---------------------------------> draining
    drain(grace_s) -------------------------------------> draining until now + grace_s
    undrain (before the grace period ends) -------------> serving
    Goodbye --------------------------------------------> stopped
    silent for timeout_s (expire) ----------------------> dead
    another process under the same id ------------------> dead (the old run), new run registered

An instance silent for 2.5 heartbeat intervals is listed ``suspect`` (a flag, not a state).
``stopped`` and ``dead`` entries stay listed for ``forget_after_s``, then are pruned.

Soft state: the controller's answer to a heartbeat (Assignment) tells the instance its state,
and the instance's heartbeats carry it back as ``assigned``. A fresh controller that hears from
an instance that says it was ``serving`` (or ``draining``) registers it in that state at once,
so serving does not stop while the controller is away and the table is whole again within one
heartbeat interval of its return.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from dsi.errors import InvalidRequest
from dsi.messages.control import Heartbeat, InstanceInfo, TransitionCount
from dsi.roles.controller.lifecycle import (
    FINAL,
    IllegalTransition,
    InstanceState,
    Transition,
    TransitionCounter,
    check_transition,
)

S = InstanceState
SUSPECT_AFTER_INTERVALS = 2.5  # two missed heartbeats, with slack for scheduling jitter
_OPERATOR_STATES = frozenset({S.DRAINING})  # what SetState may order today


class ReadyPool(Protocol):
    """Decides whether a ready instance stays unassigned (the autoscaler's ready pool)."""

    def keeps(self, role: str, serving: int) -> bool:
        """True to keep a ready instance of `role` in the pool while `serving` of it serve."""
        ...


@dataclass(slots=True)
class _Entry:
    beat: Heartbeat
    seen_at: float  # monotonic seconds of the last heartbeat
    state: InstanceState
    ended_at: float | None = None  # monotonic seconds it became stopped or dead
    drain_until: float | None = None  # monotonic seconds a drain's grace period ends (None: no drain order)


class InstanceRegistry:
    """Instances by id. `interval_s`, `timeout_s`, `forget_after_s` are seconds.

    timeout_s: an instance silent this long is ``dead``.
    forget_after_s: how long ``stopped`` and ``dead`` entries stay listed before they are pruned.
    """

    def __init__(self, interval_s: float, timeout_s: float, forget_after_s: float = 60.0) -> None:
        if not 0 < interval_s < timeout_s:
            raise ValueError(f"need 0 < interval_s < timeout_s, got {interval_s} and {timeout_s}")
        if forget_after_s <= 0:
            raise ValueError(f"forget_after_s must be > 0, got {forget_after_s}")
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.forget_after_s = forget_after_s
        self.transitions = TransitionCounter()
        self.ready_pool: ReadyPool | None = None  # None: every ready instance serves at once
        self._entries: dict[str, _Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def heartbeat(self, beat: Heartbeat, now: float) -> list[Transition]:
        """Record a heartbeat: register a new run, or refresh and follow the process's own state."""
        entry = self._entries.get(beat.instance_id)
        moves: list[Transition] = []
        if entry is not None and entry.state not in FINAL and _restarted(entry.beat, beat):
            moves += self._move(entry, S.DEAD, f"replaced by pid {beat.pid} on {beat.host}", now)
        if entry is None or entry.state in FINAL:
            entry = self._entries[beat.instance_id] = _Entry(beat, now, _entry_state(beat))
            moves.append(
                self._count(
                    Transition(
                        beat.instance_id,
                        beat.role,
                        None,
                        entry.state,
                        _registration_reason(beat, entry.state),
                    )
                )
            )
        entry.beat, entry.seen_at = beat, now
        if entry.state is S.STARTING and beat.state != "starting":
            moves += self._move(entry, S.READY, "process started", now)
        if beat.state == "stopping" and entry.state in (S.READY, S.SERVING):
            moves += self._move(entry, S.DRAINING, "process stopping", now)
        if entry.state is S.READY:
            moves += self._assign(entry, now)
        return moves

    def goodbye(self, instance_id: str, now: float, reason: str = "goodbye") -> list[Transition]:
        """Mark an instance stopped; no moves when it is unknown or already stopped or dead."""
        entry = self._entries.get(instance_id)
        if entry is None or entry.state in FINAL:
            return []
        return self._move(entry, S.STOPPED, reason, now)

    def set_state(self, instance_id: str, state: str, now: float, reason: str) -> list[Transition]:
        """An operator's order. InvalidRequest for an unknown instance or a state not orderable
        (today only ``draining``: it stops new work; moving the work away is a later task);
        IllegalTransition when the instance cannot move there from where it is."""
        entry = self._entries.get(instance_id)
        if entry is None:
            raise InvalidRequest(f"unknown instance {instance_id!r}")
        if state not in _OPERATOR_STATES:
            raise InvalidRequest(f"an operator may set {', '.join(_OPERATOR_STATES)}, not {state!r}")
        if entry.state == state:
            return []
        return self._move(entry, S(state), reason, now)

    def move(self, instance_id: str, state: InstanceState, now: float, reason: str) -> list[Transition]:
        """The controller's own order (the autoscaler's); IllegalTransition when not allowed,
        KeyError when the instance is unknown."""
        return self._move(self._entries[instance_id], state, reason, now)

    def drain(self, instance_id: str, grace_s: float, now: float, reason: str = "drain") -> list[Transition]:
        """An operator's drain order: ``draining`` now, its work moved away after ``grace_s``
        seconds. InvalidRequest for an unknown instance or a negative grace; IllegalTransition
        from a final state. A second order for a draining instance keeps the first deadline."""
        entry = self._entries.get(instance_id)
        if entry is None:
            raise InvalidRequest(f"unknown instance {instance_id!r}")
        if not grace_s >= 0:
            raise InvalidRequest(f"grace_s must be >= 0 seconds, not {grace_s}")
        if entry.state is S.DRAINING and entry.drain_until is not None:
            return []
        moves = (
            []
            if entry.state is S.DRAINING
            else self._move(entry, S.DRAINING, f"{reason}, grace {grace_s:g}s", now)
        )
        entry.drain_until = now + grace_s
        return moves

    def undrain(self, instance_id: str, now: float, reason: str = "undrain") -> list[Transition]:
        """Cancel a drain order within its grace period: back to ``serving``. InvalidRequest for
        an unknown instance; IllegalTransition when it is not draining by an order, or the grace
        period is over (its work is being moved away)."""
        entry = self._entries.get(instance_id)
        if entry is None:
            raise InvalidRequest(f"unknown instance {instance_id!r}")
        if entry.state is not S.DRAINING or entry.drain_until is None:
            raise IllegalTransition(f"{instance_id} is {entry.state}, not draining by a drain order")
        if now >= entry.drain_until:
            raise IllegalTransition(
                f"{instance_id}: the grace period ended {now - entry.drain_until:.1f}s ago; "
                f"its work is moving away"
            )
        entry.drain_until = None
        return self._move(entry, S.SERVING, reason, now)

    def in_grace(self, instance_id: str, now: float) -> bool:
        """Whether an instance is draining by an order whose grace period has not ended."""
        entry = self._entries.get(instance_id)
        return (
            entry is not None
            and entry.state is S.DRAINING
            and entry.drain_until is not None
            and now < entry.drain_until
        )

    def expire(self, now: float) -> list[Transition]:
        """Every live instance silent for timeout_s becomes dead."""
        moves: list[Transition] = []
        for entry in self._entries.values():
            if entry.state not in FINAL and self._age(entry, now) >= self.timeout_s:
                moves += self._move(entry, S.DEAD, f"no heartbeat for {self._age(entry, now):.1f}s", now)
        return moves

    def state(self, instance_id: str) -> InstanceState:
        """The lifecycle state of one instance (KeyError when unknown)."""
        return self._entries[instance_id].state

    def instances(self, now: float, role: str = "") -> list[InstanceInfo]:
        """Every instance (of `role`, or all when ""), sorted by id."""
        return [
            self._info(entry, now)
            for _, entry in sorted(self._entries.items())
            if not role or entry.beat.role == role
        ]

    def transition_counts(self) -> list[TransitionCount]:
        return [TransitionCount(*key, count) for key, count in self.transitions.counts().items()]

    def prune(self, now: float) -> list[str]:
        """Forget stopped and dead instances older than forget_after_s; the ids removed."""
        gone = [
            iid
            for iid, e in self._entries.items()
            if e.ended_at is not None and now - e.ended_at >= self.forget_after_s
        ]
        for iid in gone:
            del self._entries[iid]
        return gone

    # ---- internals ---------------------------------------------------------------------------
    def _assign(self, entry: _Entry, now: float) -> list[Transition]:
        """Where a ready instance goes: it serves, unless the ready pool keeps it (without one,
        every ready instance serves at once)."""
        if self.ready_pool is None:
            return self._move(entry, S.SERVING, "assigned (no ready pool)", now)
        role = entry.beat.role
        serving = sum(1 for e in self._entries.values() if e.beat.role == role and e.state is S.SERVING)
        if self.ready_pool.keeps(role, serving):
            return []
        return self._move(entry, S.SERVING, "assigned", now)

    def _move(self, entry: _Entry, after: InstanceState, reason: str, now: float) -> list[Transition]:
        check_transition(entry.state, after)
        move = Transition(entry.beat.instance_id, entry.beat.role, entry.state, after, reason)
        entry.state = after
        if after in FINAL:
            entry.ended_at = now
        return [self._count(move)]

    def _count(self, move: Transition) -> Transition:
        self.transitions.add(move)
        return move

    @staticmethod
    def _age(entry: _Entry, now: float) -> float:
        return max(0.0, now - entry.seen_at)

    def _info(self, entry: _Entry, now: float) -> InstanceInfo:
        beat, age = entry.beat, self._age(entry, now)
        return InstanceInfo(
            instance_id=beat.instance_id,
            role=beat.role,
            host=beat.host,
            pid=beat.pid,
            address=beat.address,
            state=str(entry.state),
            load=beat.load,
            last_seen_s=age,
            started_at=beat.started_at,
            http=beat.http,
            suspect=entry.state not in FINAL and age >= SUSPECT_AFTER_INTERVALS * self.interval_s,
            fingerprint=beat.fingerprint,
            protocol=beat.protocol,
        )


def _entry_state(beat: Heartbeat) -> InstanceState:
    """The state a new run registers in: what a previous controller assigned it, if it serves."""
    if beat.assigned in (S.SERVING, S.DRAINING):
        return S(beat.assigned)
    return S.STARTING if beat.state == "starting" else S.READY


def _registration_reason(beat: Heartbeat, state: InstanceState) -> str:
    where = f"pid {beat.pid} on {beat.host}"
    return f"registered, {where}" if state in (S.STARTING, S.READY) else f"re-registered as {state}, {where}"


def _restarted(before: Heartbeat, now: Heartbeat) -> bool:
    """Whether two heartbeats of one instance id come from different processes."""
    return (before.host, before.pid, before.started_at) != (now.host, now.pid, now.started_at)
