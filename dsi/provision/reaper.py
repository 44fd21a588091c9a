"""DeadReaper: an instance the controller declares dead is killed, so that it is replaced.

The controller declares an instance ``dead`` when its heartbeats stop (dsi.roles.controller.registry),
but a process can stop beating and still exist: stopped (SIGSTOP), hung, cut off. It keeps its
role id, ports and memory, and a provisioner that replaces only processes that exit would never
replace it. Every ``every_s`` the reaper reads the controller's table; an instance listed ``dead``
whose pid is the process the provisioner runs for that id now is killed (SIGKILL), and the
provisioner replaces it as after any death::

    ListInstances --> dead, pid P --> P runs for that id here? --yes--> SIGKILL P --> exit --> replacement
                                                               \\-no--> nothing (replaced already)

A dead entry of an earlier run (the controller lists the old pid as ``dead`` once a replacement
registers) names no running process, so a replacement is never killed. While the controller does
not answer, nothing is killed.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from dsi.errors import DsiError
from dsi.messages.control import InstanceTable, ListInstances

log = logging.getLogger(__name__)


class Killer(Protocol):
    """What the reaper needs of a provisioner (the local one has it)."""

    def kill(self, role_id: str, pid: int, why: str) -> bool: ...


class TableSource(Protocol):
    """A Peer of the controller."""

    async def connect(self, timeout: float) -> object: ...

    async def ask(self, msg: ListInstances, timeout: float) -> object: ...


class DeadReaper:
    """``provisioner``: kills its instance's process by pid; ``controller``: answers ListInstances;
    ``every_s``: seconds between two reads of the table."""

    def __init__(self, provisioner: Killer, controller: TableSource, every_s: float) -> None:
        self._provisioner = provisioner
        self._controller = controller
        self._every_s = every_s
        self.killed: list[tuple[str, int]] = []  # (role id, pid), in order

    async def run(self) -> None:
        connected = False
        while True:
            try:
                if not connected:
                    await self._controller.connect(timeout=max(1.0, self._every_s))
                    connected = True
                await self.step()
            except DsiError as exc:
                log.debug("reaper: no table from the controller (%s)", exc)
            except Exception:  # the loop must outlive one bad round
                log.exception("reaper: reading the controller's table failed")
            await asyncio.sleep(self._every_s)

    async def step(self) -> None:
        """One round: kill the dead instances whose process still runs here."""
        table = await self._controller.ask(ListInstances(), timeout=max(1.0, self._every_s))
        if not isinstance(table, InstanceTable):
            return
        for info in table.instances:
            if info.state != "dead":
                continue
            why = f"the controller declared it dead; its last heartbeat was {info.last_seen_s:.1f}s ago"
            if self._provisioner.kill(info.instance_id, info.pid, why):
                self.killed.append((info.instance_id, info.pid))
