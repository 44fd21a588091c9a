import pytest

from dsi.messages.control import Heartbeat, Load
from dsi.roles.controller.registry import InstanceRegistry

INTERVAL = 1.0
TIMEOUT = 5.0
FORGET = 30.0


def beat(
    instance_id: str = "prefill-0", role: str = "prefill", state: str = "ready", pid: int = 1234, **kw
) -> Heartbeat:
    return Heartbeat(instance_id, role, "10.0.0.2", pid, "tcp://10.0.0.2:7110", state=state, **kw)


@pytest.fixture
def reg() -> InstanceRegistry:
    return InstanceRegistry(INTERVAL, TIMEOUT, forget_after_s=FORGET)


def test_first_heartbeat_registers_with_the_reported_state(reg):
    assert reg.heartbeat(beat(state="starting"), now=100.0) is True
    assert reg.state("prefill-0", 100.0) == "starting"
    assert reg.heartbeat(beat(state="ready"), now=101.0) is False  # a refresh, not a registration
    [info] = reg.instances(101.5)
    assert (info.instance_id, info.role, info.state, info.pid) == ("prefill-0", "prefill", "ready", 1234)
    assert info.last_seen_s == pytest.approx(0.5)


def test_state_follows_heartbeat_age(reg):
    reg.heartbeat(beat(), now=0.0)
    assert reg.state("prefill-0", 2.49) == "ready"
    assert reg.state("prefill-0", 2.5) == "suspect"  # 2.5 x interval
    assert reg.state("prefill-0", 4.99) == "suspect"
    assert reg.state("prefill-0", 5.0) == "lost"  # heartbeat_timeout_s
    reg.heartbeat(beat(), now=5.5)
    assert reg.state("prefill-0", 5.6) == "ready"


def test_lost_instance_that_beats_again_is_registered_again(reg):
    reg.heartbeat(beat(), now=0.0)
    assert reg.heartbeat(beat(), now=TIMEOUT + 1) is True


def test_short_timeout_goes_from_ready_straight_to_lost():
    reg = InstanceRegistry(1.0, 2.0)
    reg.heartbeat(beat(), now=0.0)
    assert reg.state("prefill-0", 1.99) == "ready"
    assert reg.state("prefill-0", 2.0) == "lost"


def test_goodbye_marks_stopped_whatever_the_age(reg):
    reg.heartbeat(beat(), now=0.0)
    assert reg.goodbye("prefill-0", now=1.0) is True
    assert reg.state("prefill-0", 1.0) == "stopped"
    assert reg.state("prefill-0", TIMEOUT + 1) == "stopped"
    assert reg.goodbye("nobody", now=1.0) is False
    assert len(reg) == 1


def test_heartbeat_after_goodbye_registers_a_restart(reg):
    reg.heartbeat(beat(pid=1), now=0.0)
    reg.goodbye("prefill-0", now=1.0)
    assert reg.heartbeat(beat(pid=2), now=2.0) is True
    [info] = reg.instances(2.0)
    assert (info.state, info.pid) == ("ready", 2)


def test_heartbeat_from_another_process_registers_a_replacement(reg):
    reg.heartbeat(beat(pid=1, started_at=10.0), now=0.0)
    assert reg.heartbeat(beat(pid=1, started_at=10.0), now=1.0) is False
    assert reg.heartbeat(beat(pid=2, started_at=11.0), now=1.5) is True  # never found lost
    [info] = reg.instances(1.5)
    assert (info.state, info.pid) == ("ready", 2)


def test_prune_forgets_stopped_and_lost_after_a_while(reg):
    reg.heartbeat(beat("prefill-0"), now=0.0)
    reg.heartbeat(beat("prefill-1"), now=0.0)
    reg.heartbeat(beat("decode-0", role="decode"), now=0.0)
    reg.goodbye("prefill-1", now=1.0)
    for t in range(1, 35):  # decode-0 keeps beating
        reg.heartbeat(beat("decode-0", role="decode"), now=float(t))
    assert reg.prune(now=1.0 + FORGET - 0.1) == []
    assert reg.prune(now=1.0 + FORGET) == ["prefill-1"]
    assert reg.prune(now=TIMEOUT + FORGET - 0.1) == []
    assert reg.prune(now=TIMEOUT + FORGET) == ["prefill-0"]
    assert [info.instance_id for info in reg.instances(35.0)] == ["decode-0"]


def test_instances_are_sorted_and_filtered_by_role(reg):
    for iid, role in [("prefill-1", "prefill"), ("decode-0", "decode"), ("prefill-0", "prefill")]:
        reg.heartbeat(beat(iid, role=role, load=Load(running=3), http=""), now=0.0)
    assert [i.instance_id for i in reg.instances(0.0)] == ["decode-0", "prefill-0", "prefill-1"]
    assert [i.instance_id for i in reg.instances(0.0, role="prefill")] == ["prefill-0", "prefill-1"]
    assert reg.instances(0.0)[0].load == Load(running=3)


def test_clock_going_backwards_counts_as_age_zero(reg):
    reg.heartbeat(beat(), now=10.0)
    [info] = reg.instances(9.0)
    assert (info.state, info.last_seen_s) == ("ready", 0.0)


@pytest.mark.parametrize(
    ("interval", "timeout", "forget"), [(0.0, 1.0, 1.0), (2.0, 2.0, 1.0), (1.0, 2.0, 0.0)]
)
def test_bad_timings_are_rejected(interval, timeout, forget):
    with pytest.raises(ValueError):
        InstanceRegistry(interval, timeout, forget)
