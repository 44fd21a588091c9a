"""ControllerActor: the cluster's instance registry, fed by heartbeats.

Heartbeat (tell) registers or refreshes an instance, Goodbye marks it stopped, ListInstances is
answered with an InstanceTable. A sweep every heartbeat interval logs instances that turn
suspect or lost and prunes old entries. Autoscaling, drain and failover are planned.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from dsi.actor import handles
from dsi.config import ClusterConfig
from dsi.messages.control import Goodbye, Heartbeat, InstanceTable, ListInstances
from dsi.roles.controller.registry import InstanceRegistry
from dsi.roles.role import RoleActor

log = logging.getLogger(__name__)


class ControllerActor(RoleActor):
    """`clock` returns monotonic seconds; tests inject a fake one."""

    def __init__(
        self,
        name: str,
        cluster: ClusterConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        forget_after_s: float = 60.0,
    ) -> None:
        super().__init__(name)
        self.registry = InstanceRegistry(
            cluster.heartbeat_interval_s, cluster.heartbeat_timeout_s, forget_after_s
        )
        self._clock = clock
        self._logged: dict[str, str] = {}  # instance id -> last state the sweep logged

    async def on_start(self) -> None:
        self.spawn(self._sweep_every(self.registry.interval_s), name=f"{self.name}.sweep")
        await super().on_start()

    @handles
    async def heartbeat(self, msg: Heartbeat) -> None:
        if self.registry.heartbeat(msg, self._clock()):
            log.info(
                "registered %s (%s, pid %d on %s, %s)",
                msg.instance_id,
                msg.role,
                msg.pid,
                msg.host,
                msg.address,
            )
            self._logged[msg.instance_id] = msg.state

    @handles
    async def goodbye(self, msg: Goodbye) -> None:
        if self.registry.goodbye(msg.instance_id, self._clock()):
            log.info("%s said goodbye (%s)", msg.instance_id, msg.reason)
            self._logged[msg.instance_id] = "stopped"

    @handles
    async def list_instances(self, msg: ListInstances) -> InstanceTable:
        now = self._clock()
        self.registry.prune(now)
        return InstanceTable(self.registry.instances(now, msg.role), controller_id=self.name)

    def sweep(self) -> None:
        """Log state changes the heartbeats alone do not announce (suspect, lost); prune."""
        now = self._clock()
        for info in self.registry.instances(now):
            before = self._logged.get(info.instance_id)
            if info.state != before and info.state in ("suspect", "lost"):
                log.warning(
                    "%s is %s: no heartbeat for %.1fs", info.instance_id, info.state, info.last_seen_s
                )
            self._logged[info.instance_id] = info.state
        for instance_id in self.registry.prune(now):
            self._logged.pop(instance_id, None)

    async def _sweep_every(self, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)
            self.sweep()
