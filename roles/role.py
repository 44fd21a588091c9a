"""RoleActor: what every role instance has in common - a lifecycle state and a Load report.

The heartbeat task reads ``state``, ``load()`` and ``fingerprint`` each interval and sends them
to the controller (``fingerprint``: the machine fingerprint of an engine role, set once its engine
is built; None for every other role).
Asking a role with a ``Load`` message (any values) answers its current Load, so an operator or a
test can read any role's counters without knowing its kind.

    starting --start()--> ready --stopping()--> (Goodbye) --stop()--> stopping

A role whose work is done for good (a drained instance) calls ``retire()``: its host stops it
(Goodbye to the controller) and a process left with no role exits.
"""

from __future__ import annotations

import asyncio
import time

from dsi.actor import Actor, handles
from dsi.messages.control import Load
from dsi.messages.fingerprint import MachineFingerprint


class RoleActor(Actor):
    """Base of every role's actor. Subclasses with work to count override ``load``."""

    retire_reason = "stopped"

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.state = "starting"
        # This run of the role, unix seconds: its heartbeats and load reports carry it, and the
        # requests the gateway sends name it (dsi.roles.run_fence).
        self.started_at = time.time()
        self.fingerprint: MachineFingerprint | None = None
        self.retired = asyncio.Event()  # set by retire(): the host stops this role

    def retire(self, reason: str = "drained") -> None:
        """Ask the host to stop this role (its work is done for good)."""
        self.retire_reason = reason
        self.retired.set()

    async def on_start(self) -> None:
        self.state = "ready"

    def stopping(self) -> None:
        """The host begins to stop this role (before its Goodbye to the controller, which may
        take a moment): a role that must refuse new work at once does so here."""

    async def on_stop(self) -> None:
        self.state = "stopping"

    def load(self) -> Load:
        """The counters the controller's table shows and its autoscaler reads (balancers get the
        engines' own LoadReport, see dsi.roles.load_report); a role with no engine runs nothing."""
        return Load(inbox=self.inbox_depth)

    @handles
    async def report_load(self, msg: Load) -> Load:
        return self.load()
