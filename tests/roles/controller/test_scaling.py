"""The controller's Scaler over a registry fed by heartbeats: pool, burst, scale-down, targets."""

from __future__ import annotations

import pytest

from dsi.config.autoscale import AutoscaleRole, AutoscaleSection
from dsi.errors import InvalidRequest
from dsi.messages.control import Heartbeat, Load
from dsi.roles.controller.registry import InstanceRegistry
from dsi.roles.controller.scaling import Scaler

SETTLE_S = 2.0


def beat(
    instance_id: str, role: str = "decode", running: int = 0, started_at: float = 1.0, **load
) -> Heartbeat:
    return Heartbeat(
        instance_id,
        role,
        "127.0.0.1",
        7,
        f"tcp://127.0.0.1/{instance_id}",
        load=Load(running=running, **load),
        started_at=started_at,
    )


def cluster(**decode) -> tuple[InstanceRegistry, Scaler]:
    # max 4: at 3 serving, quota use 0.75 still allows the scale-down (above 0.8 it would not).
    options = {
        "min_instances": 1,
        "max_instances": 4,
        "ready_pool": 1,
        "margin": 0.0,
        "capacity": 1.0,
        **decode,
    }
    section = AutoscaleSection(interval_s=10.0, decode=AutoscaleRole(**options))
    registry = InstanceRegistry(1.0, 5.0)
    scaler = registry.ready_pool = Scaler(section, registry, settle_s=SETTLE_S)
    return registry, scaler


def states(registry: InstanceRegistry, now: float) -> dict[str, str]:
    return {info.instance_id: info.state for info in registry.instances(now)}


def counts(scaler: Scaler, now: float) -> tuple[int, int, int, int, int, int, list[str]]:
    """serving, ready, starting, draining, target, wanted, stop of decode."""
    [role] = scaler.status(now, 0.0).roles
    return role.serving, role.ready, role.starting, role.draining, role.target, role.wanted, role.stop


def test_min_instances_serve_at_once_and_the_rest_wait_in_the_pool():
    registry, scaler = cluster()
    registry.heartbeat(beat("decode-0"), 0.0)
    registry.heartbeat(beat("decode-1"), 0.0)
    registry.heartbeat(beat("prefill-0", "prefill"), 0.0)  # not scaled: serves at once
    assert states(registry, 0.0) == {"decode-0": "serving", "decode-1": "ready", "prefill-0": "serving"}
    assert counts(scaler, 0.0) == (1, 1, 0, 0, 1, 2, [])  # wanted: min 1 + pool 1


def test_a_ramp_takes_the_pool_first_starts_more_then_drains_back_down():
    registry, scaler = cluster()
    registry.heartbeat(beat("decode-0", running=2), 0.0)  # need 3 (2 * 1 is not above 2)
    registry.heartbeat(beat("decode-1"), 0.0)
    # Burst: the pool serves at once, one start refills it; the rate limit allows +1.
    decision, moves = scaler.decide(10.0)
    got = decision.decode
    assert (got.need, got.target, got.take_from_pool, got.start) == (3, 2, 1, 1)
    assert [(m.instance_id, str(m.after)) for m in moves] == [("decode-1", "serving")]
    assert counts(scaler, 10.0) == (2, 0, 1, 0, 2, 3, [])  # one started, not registered yet
    # The started instance arrives while the target is met: it waits in the pool.
    registry.heartbeat(beat("decode-2"), 12.0)
    assert states(registry, 12.0)["decode-2"] == "ready"
    decision, moves = scaler.decide(20.0)
    assert (decision.decode.target, decision.decode.take_from_pool, decision.decode.start) == (3, 1, 1)
    assert counts(scaler, 20.0) == (3, 0, 1, 0, 3, 4, [])
    registry.heartbeat(beat("decode-3"), 22.0)
    assert counts(scaler, 22.0) == (3, 1, 0, 0, 3, 4, [])
    # Load stops: down one per interval, each leaver stopped once idle (the pool is full).
    for name in ("decode-0", "decode-1", "decode-2"):
        registry.heartbeat(beat(name), 23.0)
    decision, moves = scaler.decide(30.0)
    assert (decision.decode.target, decision.decode.stop_serving) == (2, 1)
    assert [(m.instance_id, str(m.after)) for m in moves] == [
        ("decode-2", "draining")
    ]  # idle ties: highest id
    assert counts(scaler, 30.0) == (2, 1, 0, 1, 2, 3, [])
    registry.heartbeat(beat("decode-2"), 31.0)  # idle, but sent before the settle time
    assert counts(scaler, 31.0)[-1] == []
    registry.heartbeat(beat("decode-2"), 32.5)
    assert counts(scaler, 32.5)[-1] == ["decode-2"]
    registry.goodbye("decode-2", 33.0)
    scaler.housekeep(33.0)
    assert counts(scaler, 33.0) == (2, 1, 0, 0, 2, 3, [])
    decision, moves = scaler.decide(40.0)
    assert (decision.decode.target, decision.decode.stop_serving) == (1, 1)
    assert counts(scaler, 40.0) == (1, 1, 0, 1, 1, 2, [])


def test_scale_down_returns_a_serving_instance_to_a_short_pool_once_it_is_idle():
    registry, scaler = cluster(max_change=2)
    registry.heartbeat(beat("decode-0", running=2), 0.0)
    registry.heartbeat(beat("decode-1"), 0.0)
    scaler.decide(0.0)  # need 3: take decode-1, and one start (never registered here)
    registry.heartbeat(beat("decode-0"), 5.0)
    decision, moves = scaler.decide(10.0)  # need 0: target 1; the pool is empty, one goes back to it
    assert (decision.decode.target, decision.decode.return_to_pool) == (1, 1)
    [left] = [m.instance_id for m in moves]
    registry.heartbeat(beat(left), 11.0)  # idle, but sent before the settle time
    assert scaler.housekeep(11.0) == []
    registry.heartbeat(beat(left), 12.5)
    assert [(m.instance_id, str(m.after)) for m in scaler.housekeep(12.5)] == [(left, "ready")]
    assert states(registry, 12.5)[left] == "ready"


def test_a_busy_instance_taken_out_of_service_is_stopped_after_the_drain_timeout():
    section = AutoscaleSection(
        interval_s=10.0,
        drain_timeout_s=30.0,
        decode=AutoscaleRole(max_instances=3, margin=0.0, capacity=2.0),  # 2 of 3: below the quota rule
    )
    registry = InstanceRegistry(1.0, 5.0)
    scaler = registry.ready_pool = Scaler(section, registry, settle_s=SETTLE_S)
    registry.heartbeat(beat("decode-0", running=1), 0.0)
    registry.heartbeat(beat("decode-1", running=1), 0.0)
    assert states(registry, 0.0) == {"decode-0": "serving", "decode-1": "ready"}
    decision, _ = scaler.decide(0.0)  # demand 2 needs 2
    assert (decision.decode.target, decision.decode.take_from_pool) == (2, 1)
    registry.heartbeat(beat("decode-0", running=0), 5.0)
    registry.heartbeat(beat("decode-1", running=1), 5.0)
    decision, moves = scaler.decide(10.0)  # demand 1 needs 1: the idle one leaves
    assert [(m.instance_id, str(m.after)) for m in moves] == [("decode-0", "draining")]
    registry.heartbeat(beat("decode-1", running=1), 35.0)
    registry.heartbeat(beat("decode-0", running=1), 39.0)  # a request reached it before the gateway knew
    assert counts(scaler, 39.0)[-1] == []
    assert counts(scaler, 40.0)[-1] == ["decode-0"]  # 30 s after it left service


def test_prefill_demand_is_the_rate_of_uncached_tokens():
    section = AutoscaleSection(
        interval_s=10.0, prefill=AutoscaleRole(max_instances=4, margin=0.0, capacity=100.0)
    )
    registry = InstanceRegistry(1.0, 5.0)
    scaler = registry.ready_pool = Scaler(section, registry, settle_s=SETTLE_S)
    registry.heartbeat(beat("prefill-0", "prefill", uncached_tokens=500), 0.0)
    first, _ = scaler.decide(0.0)
    assert first.inputs.prefill.demand == 0.0  # no earlier counter to compare with
    registry.heartbeat(beat("prefill-0", "prefill", uncached_tokens=2500), 9.0)
    second, _ = scaler.decide(10.0)
    assert second.inputs.prefill.demand == 200.0  # 2000 tokens in 10 s
    assert (second.prefill.need, second.prefill.target, second.prefill.start) == (3, 2, 1)


def test_manual_targets_are_checked_against_the_bounds():
    _, scaler = cluster()
    with pytest.raises(InvalidRequest, match=r"5 is outside decode's bounds \[1, 4\]"):
        scaler.set_manual("decode", 5)
    with pytest.raises(InvalidRequest, match=r"'prefill' is not scaled \(scaled roles: decode\)"):
        scaler.set_manual("prefill", 1)
    scaler.set_manual("decode", 3)
    decision, _ = scaler.decide(0.0)
    assert decision.decode.rules[-2:] == ("manual", "rate_limit")
    scaler.set_manual("decode", -1)
    assert scaler.status(0.0, 0.0).roles[0].manual == -1


def test_decode_demand_is_the_peak_seen_since_the_last_decision():
    registry, scaler = cluster()
    registry.heartbeat(beat("decode-0", running=2), 0.0)
    scaler.housekeep(0.5)
    registry.heartbeat(beat("decode-0", running=0), 1.0)  # between two requests
    decision, _ = scaler.decide(1.0)
    assert decision.inputs.decode.demand == 2.0
    decision, _ = scaler.decide(11.0)  # the peak starts over after each decision
    assert decision.inputs.decode.demand == 0.0


def test_an_ep_group_with_fewer_healthy_ranks_counts_as_less_capacity():
    registry, scaler = cluster(min_instances=2, ready_pool=0)
    # decode-0 serves with 3 of its 4 expert-parallel ranks, decode-1 with all of them.
    registry.heartbeat(beat("decode-0", running=3, ep_ranks=3, ep_configured=4), 0.0)
    registry.heartbeat(beat("decode-1", running=0, ep_ranks=4, ep_configured=4), 0.0)
    decision, _ = scaler.decide(10.0)
    assert decision.inputs.decode.capacity == pytest.approx(0.875)  # 1.0 x mean(3/4, 4/4)
    assert decision.decode.need == 4  # 3 requests need ceil(3 / 0.875) instances, not 3
