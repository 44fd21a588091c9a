"""Which instances to start and stop so that one role runs as many as the controller wants.

A pure function over what the provisioner lists; no I/O. The controller names the instances to
stop (it took them out of service first); the provisioner side only chooses which declared ids
to start, in the config's order::

    declared  decode-0 decode-1 decode-2 decode-3     wanted 3, stop [decode-1]
    running   decode-0 decode-1                   --> stop decode-1, start decode-2 decode-3

An instance counts as running from its start until it is stopped (starting, ready, and in
backoff while it is being replaced). One being stopped is neither running nor started again until
it has stopped; one given up (failed) is not started again here.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from dsi.provision.base import ProvisionedInstance

RUNNING = frozenset({"starting", "ready", "backoff"})


@dataclass(slots=True, frozen=True)
class Actions:
    start: tuple[str, ...] = ()
    stop: tuple[str, ...] = ()


def reconcile(
    declared: Sequence[str],
    listed: Sequence[ProvisionedInstance],
    wanted: int,
    stop: Collection[str] = (),
    busy: Collection[str] = (),
) -> Actions:
    """The actions for one role.

    declared: the role's ids, in config order. listed: every instance the provisioner knows.
    wanted: how many should run. stop: ids the controller wants stopped. busy: ids a start or stop
    is under way for (they count as they will be: a start as running, a stop as gone).
    """
    states = {inst.role_id: inst.state for inst in listed}
    running = [i for i in declared if states.get(i) in RUNNING and i not in busy]
    stopping = [i for i in running if i in stop]
    keep = len(running) - len(stopping) + sum(1 for i in busy if i in declared and i not in stop)
    free = [i for i in declared if i not in busy and states.get(i, "stopped") == "stopped"]
    return Actions(start=tuple(free[: max(0, wanted - keep)]), stop=tuple(stopping))
