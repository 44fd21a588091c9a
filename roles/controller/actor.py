"""ControllerActor: the cluster's instance registry and lifecycle owner, fed by heartbeats.

Heartbeat registers or refreshes an instance and is answered with its Assignment, Goodbye marks
it stopped, SetState is an operator's order (draining), ListInstances is answered with an
InstanceTable that also carries the transition counts. A sweep every heartbeat interval marks
silent instances dead and prunes old entries. Every lifecycle move is logged on one line.

With an [autoscale] section a Scaler (:mod:`dsi.roles.controller.scaling`) decides every
``interval_s`` which ready instances serve and which stay in the ready pool, and how many
instances each scaled role wants; GetScale reports it, SetScale is an operator's target.
``Drain`` marks an instance draining (the gateway sends it no new work) and passes the order on
to it (``DrainOrder`` at its control address): after the grace period a decode moves its
running requests with their KV to other decodes, a prefill finishes its work, and the
instance stops. ``Undrain`` within the grace period cancels it at the instance first, then
makes it serving again.

With a KubernetesProvisioner as well (``[provisioner] kind = "kubernetes"``), the controller
follows its own targets (:mod:`dsi.roles.controller.provisioning`): it adopts the pods that run,
then scales the StatefulSets every heartbeat interval; stopping it leaves every pod running.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence

import zmq.asyncio

from dsi.actor import handles
from dsi.config import ClusterConfig
from dsi.config.autoscale import AutoscaleSection
from dsi.errors import DsiError, InvalidRequest
from dsi.messages import ALL
from dsi.messages.control import (
    Assignment,
    Drain,
    GetScale,
    Goodbye,
    Heartbeat,
    InstanceInfo,
    InstanceTable,
    ListInstances,
    ScaleStatus,
    SetScale,
    SetState,
    Undrain,
)
from dsi.messages.migrate import DrainOrder
from dsi.provision.kubernetes import KubernetesProvisioner
from dsi.roles.controller.lifecycle import InstanceState, Transition
from dsi.roles.controller.provisioning import ClusterFollower
from dsi.roles.controller.registry import InstanceRegistry
from dsi.roles.controller.scaling import Scaler
from dsi.roles.role import RoleActor
from dsi.transport.client import Peer
from dsi.transport.security import CurveKeys

log = logging.getLogger(__name__)


class ControllerActor(RoleActor):
    """`clock` returns monotonic seconds, `wall` unix seconds; tests inject fake ones.
    `autoscale` None: every ready instance serves at once and nothing is scaled.
    `provisioner`: with `autoscale`, the controller starts and stops the ids of `declared` (per
    scaled kind, in config order) with it; it owns the provisioner from then on."""

    def __init__(
        self,
        name: str,
        cluster: ClusterConfig,
        *,
        autoscale: AutoscaleSection | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        forget_after_s: float = 60.0,
        keys: CurveKeys | None = None,
        provisioner: KubernetesProvisioner | None = None,
        declared: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        super().__init__(name)
        self.registry = InstanceRegistry(
            cluster.heartbeat_interval_s, cluster.heartbeat_timeout_s, forget_after_s
        )
        self.scaler: Scaler | None = None
        if autoscale is not None:
            # Gateways refresh their instance lists about once a second (and at least once a heartbeat).
            settle_s = 2.0 * max(1.0, cluster.heartbeat_interval_s)
            self.scaler = self.registry.ready_pool = Scaler(autoscale, self.registry, settle_s=settle_s)
        self._clock = clock
        self._wall = wall
        self._keys = keys  # to pass drain orders on to instances
        self._ctx: zmq.asyncio.Context | None = None
        self.follower: ClusterFollower | None = None
        if provisioner is not None and self.scaler is not None:
            every_s = cluster.heartbeat_interval_s
            self.follower = ClusterFollower(provisioner, declared or {}, self._scale_status, every_s)

    async def on_start(self) -> None:
        self.spawn(self._sweep_every(self.registry.interval_s), name=f"{self.name}.sweep")
        if self.scaler is not None:
            self.spawn(self._scale_every(self.scaler.section.interval_s), name=f"{self.name}.scale")
        if self.follower is not None:
            self.spawn(self.follower.run(), name=f"{self.name}.provision")
        await super().on_start()

    async def on_stop(self) -> None:
        await super().on_stop()
        if self.follower is not None:
            await self.follower.close()
        if self._ctx is not None:
            self._ctx.destroy(linger=0)

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
    async def drain(self, msg: Drain) -> InstanceInfo:
        now = self._clock()
        _log(self.registry.drain(msg.instance_id, msg.grace_s, now))
        info = self._info(msg.instance_id)
        await self._order(info, DrainOrder(msg.grace_s))  # an unreachable instance: still draining
        return info

    @handles
    async def undrain(self, msg: Undrain) -> InstanceInfo:
        now = self._clock()
        if not self.registry.in_grace(msg.instance_id, now):
            _log(self.registry.undrain(msg.instance_id, now))  # raises why not
        await self._order(self._info(msg.instance_id), DrainOrder(cancel=True))  # it may refuse: too late
        _log(self.registry.undrain(msg.instance_id, self._clock()))
        return self._info(msg.instance_id)

    def _info(self, instance_id: str) -> InstanceInfo:
        [info] = [i for i in self.registry.instances(self._clock()) if i.instance_id == instance_id]
        return info

    async def _order(self, info: InstanceInfo, order: DrainOrder, timeout_s: float = 5.0) -> None:
        """Pass a drain order on to the instance; its refusal is raised to the operator, an
        instance that cannot be reached is logged (a drain stands; an undrain then fails)."""
        if self._ctx is None:
            self._ctx = zmq.asyncio.Context()
        peer = Peer(
            info.address,
            self._ctx,
            types=ALL,
            peer_id=self.name,
            role="controller",
            keys=self._keys,
            timeout=timeout_s,
        )
        try:
            await peer.connect(timeout_s)
            await peer.ask(order, timeout=timeout_s)
        except DsiError as exc:
            if order.cancel or exc.code in ("illegal_transition", "invalid_request"):
                raise
            log.warning("drain order to %s not delivered: %s: %s", info.instance_id, exc.code, exc.message)
        finally:
            await peer.close()

    @handles
    async def list_instances(self, msg: ListInstances) -> InstanceTable:
        self.sweep()
        return InstanceTable(
            self.registry.instances(self._clock(), msg.role),
            controller_id=self.name,
            transitions=self.registry.transition_counts(),
        )

    @handles
    async def get_scale(self, msg: GetScale) -> ScaleStatus:
        return self._scale_status()

    def _scale_status(self) -> ScaleStatus:
        if self.scaler is None:
            return ScaleStatus(enabled=False)
        self.sweep()
        return self.scaler.status(self._clock(), self._wall())

    @handles
    async def set_scale(self, msg: SetScale) -> ScaleStatus:
        if self.scaler is None:
            raise InvalidRequest("autoscaling is off: the config has no [autoscale] section")
        self.scaler.set_manual(msg.role, msg.instances)
        held = "handed back to the autoscaler" if msg.instances == -1 else f"held at {msg.instances} serving"
        log.info("autoscale %s: %s by an operator", msg.role, held)
        return self.scaler.status(self._clock(), self._wall())

    def sweep(self) -> None:
        """Mark instances silent for the heartbeat timeout dead; prune old stopped and dead ones;
        return drained instances to the ready pool."""
        now = self._clock()
        _log(self.registry.expire(now))
        self.registry.prune(now)
        if self.scaler is not None:
            _log(self.scaler.housekeep(now))

    def scale(self) -> None:
        """One autoscaler decision, its moves applied and logged."""
        assert self.scaler is not None
        self.sweep()
        decision, moves = self.scaler.decide(self._clock())
        acted = bool(moves) or any(
            decision.role(name).start or decision.role(name).stop_ready for name in self.scaler.roles()
        )
        for name in self.scaler.roles():
            text = decision.role(name).describe().replace("\n", ";")
            log.log(logging.INFO if acted else logging.DEBUG, "autoscale %s: %s", name, text)
        _log(moves)

    async def _sweep_every(self, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)
            self.sweep()

    async def _scale_every(self, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                self.scale()
            except Exception:  # a bad decision must not end the loop that makes the next one
                log.exception("autoscale: the decision failed")


def _log(moves: list[Transition]) -> None:
    for move in moves:
        level = logging.WARNING if move.after is InstanceState.DEAD else logging.INFO
        log.log(level, "lifecycle %s", move.describe())
