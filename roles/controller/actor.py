"""ControllerActor: the cluster's instance registry and lifecycle owner, fed by heartbeats.

Heartbeat registers or refreshes an instance and is answered with its Assignment, Goodbye marks
it stopped, SetState is an operator's order (draining), ListInstances is answered with an
InstanceTable that also carries the transition counts. A sweep every heartbeat interval marks
silent instances dead and prunes old entries. Every lifecycle move is logged on one line.
Autoscaling, drain with migration and failover are planned.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from dsi.actor import handles
from dsi.config import ClusterConfig
from dsi.messages.control import (
    Assignment,
    Goodbye,
    Heartbeat,
    InstanceInfo,
    InstanceTable,
    ListInstances,
    SetState,
)
from dsi.roles.controller.lifecycle import InstanceState, Transition
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

    async def on_start(self) -> None:
        self.spawn(self._sweep_every(self.registry.interval_s), name=f"{self.name}.sweep")
        await super().on_start()

    @handles
    async def heartbeat(self, msg: Heartbeat) -> Assignment:
        _log(self.registry.heartbeat(msg, self._clock()))
        return Assignment(str(self.registry.state(msg.instance_id)))

    @handles
    async def goodbye(self, msg: Goodbye) -> None:
        _log(self.registry.goodbye(msg.instance_id, self._clock(), f"goodbye: {msg.reason}"))

    @handles
    async def set_state(self, msg: SetState) -> InstanceInfo:
        now = self._clock()
        _log(self.registry.set_state(msg.instance_id, msg.state, now, msg.reason))
        [info] = [i for i in self.registry.instances(now) if i.instance_id == msg.instance_id]
        return info

    @handles
    async def list_instances(self, msg: ListInstances) -> InstanceTable:
        self.sweep()
        return InstanceTable(
            self.registry.instances(self._clock(), msg.role),
            controller_id=self.name,
            transitions=self.registry.transition_counts(),
        )

    def sweep(self) -> None:
        """Mark instances silent for the heartbeat timeout dead; prune old stopped and dead ones."""
        now = self._clock()
        _log(self.registry.expire(now))
        self.registry.prune(now)

    async def _sweep_every(self, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)
            self.sweep()


def _log(moves: list[Transition]) -> None:
    for move in moves:
        level = logging.WARNING if move.after is InstanceState.DEAD else logging.INFO
        log.log(level, "lifecycle %s", move.describe())
