"""Decode instances: the closed-form stepping against a loop that takes one step at a time, and
the routers over load snapshots."""

from __future__ import annotations

import heapq
import random

import pytest

from dsi.balance import InstanceLoad, NoInstance
from dsi.sim.decode import DecodeInstance, decode_router
from dsi.sim.step_time import StepTimeModel

MODEL = StepTimeModel(0.01, 0.001, 1e-6)


def _closed_form(joins: list[tuple[float, int, int]]) -> dict[int, float]:
    """Finish time of each request; joins are (time, kv, steps), reserved at 0."""
    inst = DecodeInstance("d0", MODEL, 64, 10**9)
    events: list[tuple] = []
    seq = 0
    for i, (t, kv, _) in enumerate(joins):
        inst.reserve(kv)
        events.append((t, seq := seq + 1, "join", i))
    heapq.heapify(events)
    done: dict[int, float] = {}
    while events:
        now, _, kind, arg = heapq.heappop(events)
        if kind == "join":
            t, kv, steps = joins[arg]
            moved = inst.join(arg, kv, steps, now)
        else:
            version, steps = arg
            if version != inst.version:
                continue
            left, moved = inst.boundary(now, steps)
            done.update((i, now) for i in left)
        if moved is not None:
            heapq.heappush(events, (moved[0], seq := seq + 1, "step", (inst.version, moved[1])))
    return done


def _one_step_at_a_time(joins: list[tuple[float, int, int]]) -> dict[int, float]:
    """The same with a loop over every step: joiners enter at the first boundary at or after
    their arrival; each step emits a token of every request in the batch."""
    waiting = sorted(range(len(joins)), key=lambda i: (joins[i][0], i))
    batch: dict[int, list[int]] = {}  # request -> [kv, steps left]
    now, done = 0.0, {}
    while waiting or batch:
        if not batch:
            now = max(now, joins[waiting[0]][0])
        while waiting and joins[waiting[0]][0] <= now:
            i = waiting.pop(0)
            batch[i] = [joins[i][1], joins[i][2]]
        step = MODEL.step_s(len(batch), sum(kv for kv, _ in batch.values()))
        now += step
        for i in list(batch):
            batch[i][0] += 1
            batch[i][1] -= 1
            if batch[i][1] == 0:
                done[i] = now
                del batch[i]
    return done


def test_closed_form_stepping_matches_one_step_at_a_time():
    rng = random.Random(7)
    joins = [(rng.uniform(0, 2.0), rng.randrange(1, 50_000), rng.randrange(1, 200)) for _ in range(40)]
    fast, slow = _closed_form(joins), _one_step_at_a_time(joins)
    assert fast.keys() == slow.keys() == set(range(40))
    for i in fast:
        assert fast[i] == pytest.approx(slow[i], rel=1e-9, abs=1e-9)


def test_load_counts_reserved_pending_and_running_requests_with_their_kv():
    inst = DecodeInstance("d0", MODEL, 8, 1_000)
    inst.reserve(100)
    inst.reserve(200)
    assert inst.load(0.0).running_requests == 2 and inst.load(0.0).kv_tokens == 300
    inst.join(0, 100, 5, 0.0)
    left, _ = inst.boundary(0.0, 0)
    assert left == [] and inst.batch == 1
    load = inst.load(MODEL.steps_s(1, 100, 3) + 1e-9)  # three steps later: 3 more KV tokens
    assert load.running_requests == 2 and load.kv_tokens == 103 + 200


def _decodes(kv: list[int]) -> list[InstanceLoad]:
    return [
        InstanceLoad(
            id=f"d{i}",
            role="decode",
            running_requests=1,
            kv_tokens=k,
            max_requests=4,
            kv_capacity_tokens=1_000,
        )
        for i, k in enumerate(kv)
    ]


def test_routers_pick_by_their_rule_and_refuse_when_nothing_fits():
    loads = _decodes([900, 100, 500])
    assert decode_router("least-loaded")(50, loads) == "d1"
    rr = decode_router("round-robin")
    assert [rr(50, loads) for _ in range(4)] == ["d0", "d1", "d2", "d0"]
    assert decode_router("bands")(50, loads) == "d1"
    with pytest.raises(NoInstance):
        decode_router("round-robin")(950, loads)
    with pytest.raises(ValueError, match="unknown decode router"):
        decode_router("random")


def test_a_reserve_waits_for_the_step_in_progress():
    inst = DecodeInstance("d0", MODEL, 8, 1_000)
    assert inst.step_end(3.0) == 3.0  # idle: at once
    inst.reserve(100)
    inst.join(0, 100, 50, 0.0)
    inst.boundary(0.0, 0)
    one, two = MODEL.steps_s(1, 100, 1), MODEL.steps_s(1, 100, 2)
    assert inst.step_end(one / 2) == pytest.approx(one)
    assert inst.step_end(one) == pytest.approx(one)  # a boundary: nothing to wait for
    assert inst.step_end(one + 1e-6) == pytest.approx(two)


def test_a_pace_change_mid_run_moves_the_next_boundary_by_the_work_left():
    inst = DecodeInstance("d0", MODEL, 8, 1_000)
    inst.reserve(100)
    inst.join(0, 100, 10, 0.0)
    _, (at, steps) = inst.boundary(0.0, 0)
    assert steps == 10 and at == pytest.approx(MODEL.steps_s(1, 100, 10))
    half = at / 2
    at2, steps2 = inst.retime(half, 2.0)  # the rest at half speed
    assert steps2 == 10 and at2 == pytest.approx(half + 2 * (at - half))
    assert inst.retime(half, 2.0) is None  # unchanged
    assert inst.load(half + 1e-9).kv_tokens == 100 + inst.model.steps_within(1, 100, half)
    left, moved = inst.boundary(at2, steps2)
    assert left == [0] and moved is None and inst.busy_s == pytest.approx(at2)
