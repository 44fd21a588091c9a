import pytest

from dsi.actor import LocalRef
from dsi.config import ClusterConfig
from dsi.errors import InvalidRequest
from dsi.messages.control import (
    Assignment,
    Goodbye,
    Heartbeat,
    InstanceTable,
    ListInstances,
    Load,
    SetState,
)
from dsi.roles.controller import ControllerActor


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def beat(instance_id: str, role: str) -> Heartbeat:
    return Heartbeat(instance_id, role, "127.0.0.1", 42, "tcp://127.0.0.1:7110", load=Load(queued=2))


async def test_controller_answers_the_instance_table_from_heartbeats():
    clock = FakeClock()
    cluster = ClusterConfig(
        controller="tcp://127.0.0.1:7100", heartbeat_interval_s=1.0, heartbeat_timeout_s=5.0
    )
    actor = ControllerActor("controller-0", cluster, clock=clock, forget_after_s=10.0)
    ref = LocalRef(actor)
    await actor.start()
    try:
        ref.tell(beat("prefill-0", "prefill"))
        ref.tell(beat("decode-0", "decode"))
        table = await ref.ask(ListInstances())
        assert isinstance(table, InstanceTable) and table.controller_id == "controller-0"
        assert [(i.instance_id, i.state, i.load.queued) for i in table.instances] == [
            ("decode-0", "serving", 2),
            ("prefill-0", "serving", 2),
        ]
        assert await ref.ask(beat("decode-0", "decode")) == Assignment("serving")
        await ref.ask(Goodbye("decode-0"))
        clock.now += 3.0
        assert {i.instance_id: (i.state, i.suspect) for i in (await ref.ask(ListInstances())).instances} == {
            "decode-0": ("stopped", False),
            "prefill-0": ("serving", True),
        }
        clock.now += 3.0
        table = await ref.ask(ListInstances("prefill"))
        assert [i.state for i in table.instances] == ["dead"]
        assert [(c.role, c.before, c.after, c.count) for c in table.transitions] == [
            ("decode", "none", "ready", 1),
            ("decode", "ready", "serving", 1),
            ("decode", "serving", "stopped", 1),
            ("prefill", "none", "ready", 1),
            ("prefill", "ready", "serving", 1),
            ("prefill", "serving", "dead", 1),
        ]
        clock.now += 10.0  # past forget_after_s for both
        actor.sweep()
        assert (await ref.ask(ListInstances())).instances == []
        assert await ref.ask(Load()) == Load()  # every role answers its own load
    finally:
        await actor.stop()


async def test_an_operator_drains_an_instance_and_the_move_is_logged(caplog):
    cluster = ClusterConfig(
        controller="tcp://127.0.0.1:7100", heartbeat_interval_s=1.0, heartbeat_timeout_s=5.0
    )
    actor = ControllerActor("controller-0", cluster, clock=FakeClock())
    ref = LocalRef(actor)
    await actor.start()
    try:
        caplog.set_level("INFO", logger="dsi.roles.controller.actor")
        ref.tell(beat("decode-0", "decode"))
        info = await ref.ask(SetState("decode-0", "draining", reason="maintenance"))
        assert info.state == "draining"
        assert await ref.ask(beat("decode-0", "decode")) == Assignment("draining")
        assert "decode-0 (decode): serving -> draining (maintenance)" in caplog.text
        with pytest.raises(InvalidRequest):
            await ref.ask(SetState("nobody", "draining"))
    finally:
        await actor.stop()
