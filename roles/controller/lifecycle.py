"""Instance lifecycle as the controller owns it: the states, the allowed moves, a move counter.

Pure data and checks, no I/O::

    (registered) --> starting --> ready --(assigned)--> serving <--> draining (undrain: in its grace period)
                        |           |  ^                   |           |  |
                        |           |  +-------(drained back to the pool)-+
                        +-----------+----------------------+-----------+--> stopped (Goodbye)
                                                                       +--> dead (missed heartbeats)

An instance registers in ``starting`` or ``ready`` (a fresh process), or straight in ``serving``
or ``draining`` when it re-registers with a restarted controller and reports that state as its
last assignment (controller state is soft, see :mod:`dsi.roles.controller.registry`).
``stopped`` and ``dead`` are final for one run of an instance: a process that beats again
afterwards registers as a new run. A registration counts as a move from ``none``.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass

from dsi.errors import DsiError, register_error


class InstanceState(enum.StrEnum):
    STARTING = "starting"
    READY = "ready"  # up and unassigned: the ready pool
    SERVING = "serving"  # the gateway routes new work to it
    DRAINING = "draining"  # no new work; running streams continue
    STOPPED = "stopped"  # said Goodbye
    DEAD = "dead"  # missed heartbeats for heartbeat_timeout_s, or replaced by another process


S = InstanceState
FINAL = frozenset({S.STOPPED, S.DEAD})
ENTRY = frozenset({S.STARTING, S.READY, S.SERVING, S.DRAINING})  # states a registration may take
TRANSITIONS: frozenset[tuple[InstanceState, InstanceState]] = frozenset(
    {
        (S.STARTING, S.READY),
        (S.READY, S.SERVING),
        (S.READY, S.DRAINING),
        (S.SERVING, S.DRAINING),
        (S.DRAINING, S.READY),  # the autoscaler returns a drained instance to the ready pool
        (S.DRAINING, S.SERVING),  # an undrain during the grace period
        *((live, end) for live in (S.STARTING, S.READY, S.SERVING, S.DRAINING) for end in FINAL),
    }
)
NONE = "none"  # the `from` label of a registration


@register_error
class IllegalTransition(DsiError):
    code = "illegal_transition"


def check_transition(before: InstanceState | None, after: InstanceState) -> None:
    """Raise IllegalTransition unless `before` -> `after` is allowed (`before` None: registration)."""
    allowed = after in ENTRY if before is None else (before, after) in TRANSITIONS
    if not allowed:
        raise IllegalTransition(f"{before or NONE} -> {after} is not an allowed lifecycle transition")


@dataclass(slots=True, frozen=True)
class Transition:
    """One move of one instance; `before` None for a registration."""

    instance_id: str
    role: str
    before: InstanceState | None
    after: InstanceState
    reason: str

    def describe(self) -> str:
        return f"{self.instance_id} ({self.role}): {self.before or NONE} -> {self.after} ({self.reason})"


class TransitionCounter:
    """Moves counted by (role, from, to); `from` is "none" for registrations."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[str, str, str]] = Counter()

    def add(self, move: Transition) -> None:
        self._counts[(move.role, str(move.before or NONE), str(move.after))] += 1

    def counts(self) -> dict[tuple[str, str, str], int]:
        """{(role, from, to): count}, sorted by key."""
        return dict(sorted(self._counts.items()))
