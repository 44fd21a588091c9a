"""The controller passes drain orders on to the instance (a real server on 127.0.0.1), and an
undrain the instance refuses leaves it draining."""

import pytest
import zmq.asyncio

from dsi.actor import Actor, LocalRef, handles
from dsi.config import ClusterConfig
from dsi.messages.control import Drain, Heartbeat, InstanceInfo, Undrain
from dsi.messages.migrate import DrainOrder
from dsi.roles.controller import ControllerActor
from dsi.roles.controller.lifecycle import IllegalTransition
from dsi.transport.server import ActorServer


class Instance(Actor):
    """Records the orders it gets; refuses a cancel once ``too_late``."""

    def __init__(self) -> None:
        super().__init__("decode-0")
        self.orders: list[DrainOrder] = []
        self.too_late = False

    @handles
    async def drain_order(self, msg: DrainOrder) -> None:
        if msg.cancel and self.too_late:
            raise IllegalTransition("decode-0: the grace period is over")
        self.orders.append(msg)


async def test_drain_and_undrain_reach_the_instance_and_a_refusal_keeps_it_draining():
    ctx = zmq.asyncio.Context()
    instance = Instance()
    server = ActorServer(instance, "tcp://127.0.0.1:*", ctx, role="decode")
    await server.start()
    cluster = ClusterConfig(
        controller="tcp://127.0.0.1:7100", heartbeat_interval_s=1.0, heartbeat_timeout_s=5.0
    )
    controller = ControllerActor("controller-0", cluster)
    ref = LocalRef(controller)
    await controller.start()
    try:
        await ref.ask(Heartbeat("decode-0", "decode", "127.0.0.1", 42, server.address))
        info = await ref.ask(Drain("decode-0", 30.0))
        assert isinstance(info, InstanceInfo) and info.state == "draining"
        assert (await ref.ask(Undrain("decode-0"))).state == "serving"
        assert instance.orders == [DrainOrder(30.0), DrainOrder(cancel=True)]
        await ref.ask(Drain("decode-0", 30.0))
        instance.too_late = True
        with pytest.raises(IllegalTransition, match="grace period is over"):
            await ref.ask(Undrain("decode-0"))
        assert controller.registry.state("decode-0") == "draining"
    finally:
        await controller.stop()
        await server.stop()
        ctx.destroy(linger=0)
