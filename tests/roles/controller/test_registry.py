import pytest

from dsi.errors import InvalidRequest
from dsi.messages.control import Heartbeat, Load
from dsi.messages.fingerprint import MachineFingerprint
from dsi.roles.controller.lifecycle import IllegalTransition
from dsi.roles.controller.registry import InstanceRegistry

INTERVAL = 1.0
TIMEOUT = 5.0
FORGET = 30.0


def beat(
    instance_id: str = "prefill-0", role: str = "prefill", state: str = "ready", pid: int = 1234, **kw
) -> Heartbeat:
    return Heartbeat(instance_id, role, "10.0.0.2", pid, "tcp://10.0.0.2:7110", state=state, **kw)


def moves(transitions) -> list[tuple[str, str, str]]:
    return [(t.instance_id, str(t.before or "none"), str(t.after)) for t in transitions]


@pytest.fixture
def reg() -> InstanceRegistry:
    return InstanceRegistry(INTERVAL, TIMEOUT, forget_after_s=FORGET)


def test_a_starting_instance_registers_then_is_ready_and_assigned_serving(reg):
    assert moves(reg.heartbeat(beat(state="starting"), now=100.0)) == [("prefill-0", "none", "starting")]
    assert reg.state("prefill-0") == "starting"
    assert moves(reg.heartbeat(beat(state="ready"), now=101.0)) == [
        ("prefill-0", "starting", "ready"),
        ("prefill-0", "ready", "serving"),  # no ready pool policy yet: assigned at once
    ]
    assert reg.heartbeat(beat(state="ready"), now=101.2) == []  # a refresh moves nothing
    [info] = reg.instances(101.5)
    assert (info.instance_id, info.role, info.state, info.pid, info.suspect) == (
        "prefill-0",
        "prefill",
        "serving",
        1234,
        False,
    )
    assert info.last_seen_s == pytest.approx(0.3)


def test_every_move_is_counted_by_role_from_and_to(reg):
    reg.heartbeat(beat(), now=0.0)
    reg.heartbeat(beat("decode-0", role="decode"), now=0.0)
    reg.goodbye("decode-0", now=1.0)
    assert [(c.role, c.before, c.after, c.count) for c in reg.transition_counts()] == [
        ("decode", "none", "ready", 1),
        ("decode", "ready", "serving", 1),
        ("decode", "serving", "stopped", 1),
        ("prefill", "none", "ready", 1),
        ("prefill", "ready", "serving", 1),
    ]


def test_late_heartbeats_flag_suspect_and_the_timeout_makes_dead(reg):
    reg.heartbeat(beat(), now=0.0)
    assert not reg.instances(2.49)[0].suspect
    assert reg.instances(2.5)[0].suspect  # 2.5 x interval
    assert reg.expire(4.99) == []
    assert moves(reg.expire(5.0)) == [("prefill-0", "serving", "dead")]  # heartbeat_timeout_s
    assert reg.expire(6.0) == []
    [info] = reg.instances(6.0)
    assert (info.state, info.suspect) == ("dead", False)


def test_a_dead_instance_that_beats_again_is_a_new_run(reg):
    reg.heartbeat(beat(), now=0.0)
    reg.expire(TIMEOUT)
    assert moves(reg.heartbeat(beat(), now=TIMEOUT + 1)) == [
        ("prefill-0", "none", "ready"),
        ("prefill-0", "ready", "serving"),
    ]


def test_goodbye_marks_stopped_once(reg):
    reg.heartbeat(beat(), now=0.0)
    assert moves(reg.goodbye("prefill-0", now=1.0)) == [("prefill-0", "serving", "stopped")]
    assert reg.goodbye("prefill-0", now=2.0) == []
    assert reg.expire(TIMEOUT + 1) == []
    assert reg.state("prefill-0") == "stopped"
    assert reg.goodbye("nobody", now=1.0) == []
    assert len(reg) == 1


def test_a_stopping_process_is_draining(reg):
    reg.heartbeat(beat(), now=0.0)
    assert moves(reg.heartbeat(beat(state="stopping"), now=1.0)) == [("prefill-0", "serving", "draining")]
    assert reg.heartbeat(beat(state="stopping"), now=2.0) == []


def test_an_operator_drains_a_serving_instance(reg):
    reg.heartbeat(beat(), now=0.0)
    [move] = reg.set_state("prefill-0", "draining", now=1.0, reason="maintenance")
    assert (str(move.before), str(move.after), move.reason) == ("serving", "draining", "maintenance")
    assert reg.heartbeat(beat(), now=2.0) == []  # heartbeats do not undo a drain
    assert reg.state("prefill-0") == "draining"
    assert reg.set_state("prefill-0", "draining", now=3.0, reason="again") == []


def test_operator_orders_that_cannot_be_taken_are_typed_errors(reg):
    with pytest.raises(InvalidRequest, match="unknown instance"):
        reg.set_state("nobody", "draining", now=0.0, reason="x")
    reg.heartbeat(beat(), now=0.0)
    with pytest.raises(InvalidRequest, match="not 'serving'"):
        reg.set_state("prefill-0", "serving", now=0.0, reason="x")
    reg.goodbye("prefill-0", now=1.0)
    with pytest.raises(IllegalTransition, match="stopped -> draining"):
        reg.set_state("prefill-0", "draining", now=2.0, reason="x")


def test_heartbeat_after_goodbye_registers_a_restart(reg):
    reg.heartbeat(beat(pid=1), now=0.0)
    reg.goodbye("prefill-0", now=1.0)
    assert moves(reg.heartbeat(beat(pid=2), now=2.0))[0] == ("prefill-0", "none", "ready")
    [info] = reg.instances(2.0)
    assert (info.state, info.pid) == ("serving", 2)


def test_heartbeat_from_another_process_ends_the_old_run(reg):
    reg.heartbeat(beat(pid=1, started_at=10.0), now=0.0)
    assert reg.heartbeat(beat(pid=1, started_at=10.0), now=1.0) == []
    assert moves(reg.heartbeat(beat(pid=2, started_at=11.0), now=1.5)) == [  # never found dead
        ("prefill-0", "serving", "dead"),
        ("prefill-0", "none", "ready"),
        ("prefill-0", "ready", "serving"),
    ]
    [info] = reg.instances(1.5)
    assert (info.state, info.pid) == ("serving", 2)


@pytest.mark.parametrize(
    ("assigned", "state"),
    [("serving", "serving"), ("draining", "draining"), ("ready", "serving"), ("", "serving")],
)
def test_a_fresh_controller_takes_the_state_an_instance_reports_it_was_assigned(reg, assigned, state):
    transitions = reg.heartbeat(beat(assigned=assigned), now=0.0)
    assert reg.state("prefill-0") == state
    if assigned in ("serving", "draining"):  # registered in that state directly, one move
        assert moves(transitions) == [("prefill-0", "none", state)]
        assert transitions[0].reason.startswith(f"re-registered as {state}")


def test_prune_forgets_stopped_and_dead_after_a_while(reg):
    reg.heartbeat(beat("prefill-0"), now=0.0)
    reg.heartbeat(beat("prefill-1"), now=0.0)
    reg.heartbeat(beat("decode-0", role="decode"), now=0.0)
    reg.goodbye("prefill-1", now=1.0)
    for t in range(1, 35):  # decode-0 keeps beating
        reg.heartbeat(beat("decode-0", role="decode"), now=float(t))
        reg.expire(float(t))
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


def test_the_instance_table_shows_the_fingerprint_of_the_last_heartbeat(reg):
    def fp(threads: int) -> MachineFingerprint:
        return MachineFingerprint.of(
            arch="x86_64", isa=("avx2",), cpu_capability="AVX2", torch="2.13.0", mkl="", onednn="",
            threads=threads, native={"row_ops": True}, env={},
        )  # fmt: skip

    reg.heartbeat(beat(), now=0.0)
    reg.heartbeat(beat("entrypoint-0", role="entrypoint"), now=0.0)
    assert [i.fingerprint for i in reg.instances(0.0)] == [None, None]  # before the engine is built
    reg.heartbeat(beat(fingerprint=fp(4)), now=1.0)
    reg.heartbeat(beat(fingerprint=fp(8)), now=2.0)
    assert [i.fingerprint for i in reg.instances(2.0)] == [None, fp(8)]


def test_clock_going_backwards_counts_as_age_zero(reg):
    reg.heartbeat(beat(), now=10.0)
    [info] = reg.instances(9.0)
    assert (info.state, info.last_seen_s) == ("serving", 0.0)


@pytest.mark.parametrize(
    ("interval", "timeout", "forget"), [(0.0, 1.0, 1.0), (2.0, 2.0, 1.0), (1.0, 2.0, 0.0)]
)
def test_bad_timings_are_rejected(interval, timeout, forget):
    with pytest.raises(ValueError):
        InstanceRegistry(interval, timeout, forget)
