"""The controller actor with [autoscale]: the ready pool at registration, GetScale, SetScale,
one decision with its moves logged; without [autoscale], the scale calls say it is off."""

from __future__ import annotations

import pytest

from dsi.actor import LocalRef
from dsi.config import ClusterConfig
from dsi.config.autoscale import AutoscaleRole, AutoscaleSection
from dsi.errors import InvalidRequest
from dsi.messages.control import Assignment, GetScale, Heartbeat, Load, ScaleStatus, SetScale
from dsi.roles.controller import ControllerActor

CLUSTER = ClusterConfig(controller="tcp://127.0.0.1:7100", heartbeat_interval_s=1.0, heartbeat_timeout_s=5.0)
SECTION = AutoscaleSection(
    interval_s=30.0, decode=AutoscaleRole(max_instances=4, ready_pool=1, margin=0.0, capacity=2.0)
)


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def beat(instance_id: str, running: int = 0) -> Heartbeat:
    return Heartbeat(
        instance_id, "decode", "127.0.0.1", 42, "tcp://127.0.0.1:7120", load=Load(running=running)
    )


async def test_the_pool_keeps_a_ready_instance_until_a_decision_takes_it(caplog):
    clock, wall = FakeClock(100.0), FakeClock(1.7e9)
    actor = ControllerActor("controller-0", CLUSTER, autoscale=SECTION, clock=clock, wall=wall)
    ref = LocalRef(actor)
    await actor.start()
    try:
        caplog.set_level("INFO", logger="dsi.roles.controller.actor")
        assert await ref.ask(beat("decode-0", running=4)) == Assignment("serving")
        assert await ref.ask(beat("decode-1")) == Assignment("ready")
        status = await ref.ask(GetScale())
        assert isinstance(status, ScaleStatus) and status.enabled and status.decisions == []
        [role] = status.roles
        assert (role.serving, role.ready, role.target, role.wanted, role.manual) == (1, 1, 1, 2, -1)

        actor.scale()  # 4 active requests at 2 per instance: need 3, +1 this interval
        assert await ref.ask(beat("decode-1")) == Assignment("serving")
        assert "decode-1 (decode): ready -> serving (autoscaler: taken from the ready pool)" in caplog.text
        assert "autoscale decode: need 3, target 2, take 1, start 1" in caplog.text
        status = await ref.ask(GetScale())
        [entry] = status.decisions
        assert (entry.at, entry.role, entry.serving, entry.ready, entry.demand) == (
            1.7e9,
            "decode",
            1,
            1,
            4.0,
        )
        assert (entry.need, entry.target, entry.take, entry.start) == (3, 2, 1, 1)
        assert status.roles[0].wanted == 3

        status = await ref.ask(SetScale("decode", 1))
        assert status.roles[0].manual == 1
        with pytest.raises(InvalidRequest, match=r"0 is outside decode's bounds \[1, 4\]"):
            await ref.ask(SetScale("decode", 0))
        with pytest.raises(InvalidRequest, match="'prefill' is not scaled"):
            await ref.ask(SetScale("prefill", 1))
    finally:
        await actor.stop()


async def test_without_autoscale_every_ready_instance_serves_and_scaling_is_off():
    actor = ControllerActor("controller-0", CLUSTER, clock=FakeClock(0.0))
    ref = LocalRef(actor)
    await actor.start()
    try:
        assert await ref.ask(beat("decode-0")) == Assignment("serving")
        assert await ref.ask(beat("decode-1")) == Assignment("serving")
        assert await ref.ask(GetScale()) == ScaleStatus(enabled=False)
        with pytest.raises(
            InvalidRequest, match=r"autoscaling is off: the config has no \[autoscale\] section"
        ):
            await ref.ask(SetScale("decode", 1))
    finally:
        await actor.stop()
