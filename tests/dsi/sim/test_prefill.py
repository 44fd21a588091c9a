"""Prefill instances (first come first served) and the routers over their loads."""

from __future__ import annotations

import pytest

from dsi.balance import InstanceLoad
from dsi.engine.hit_policy import NO_HIT
from dsi.sim.prefill import PrefillInstance, PrefillJob, prefill_router


def test_jobs_run_one_at_a_time_and_the_load_counts_what_is_left():
    p = PrefillInstance("p0")
    assert p.add(PrefillJob(0, 1_000, NO_HIT, 2.0, 1.0), now=0.0)
    assert not p.add(PrefillJob(1, 500, NO_HIT, 1.0, 1.0), now=0.5)
    load = p.load(1.0)  # half of the first job left
    assert (load.queued_tokens, load.running_requests) == (1_000, 2)
    assert [j.request for j in p.finish()] == [0] and p.start(2.0) and p.done_at == 3.0
    assert p.busy_s == 2.0
    assert [j.request for j in p.finish()] == [1] and p.busy_s == 3.0 and p.idle


def test_a_batch_takes_what_waits_up_to_its_tokens_and_ends_for_all_at_once():
    p = PrefillInstance("p0", batch_tokens=1_500)
    assert p.add(PrefillJob(0, 2_000, NO_HIT, 2.0, 1.0), now=0.0)  # alone over the budget: runs
    for i, tokens in enumerate((600, 700, 300), start=1):
        assert not p.add(PrefillJob(i, tokens, NO_HIT, tokens / 1_000, 1.0), now=0.5)
    assert [j.request for j in p.finish()] == [0] and p.start(2.0)
    assert [j.request for j in p.batch] == [1, 2] and p.done_at == pytest.approx(3.3)  # 600 + 700
    assert p.load(2.0).queued_tokens == 1_600 and p.load(2.0).running_requests == 3
    assert [j.request for j in p.finish()] == [1, 2] and p.start(3.3) and len(p.batch) == 1


def test_a_slower_pace_stretches_what_is_left_of_the_running_job():
    p = PrefillInstance("p0")
    p.add(PrefillJob(0, 1_000, NO_HIT, 2.0, 1.0), now=0.0)
    version = p.version
    assert p.retime(1.0, 3.0) and p.version > version  # half left: 1 s of work, 3 s of wall
    assert p.done_at == pytest.approx(4.0)
    assert p.load(2.5).queued_tokens == 250  # a quarter of the work left
    assert not p.retime(2.0, 3.0)  # the same pace: nothing moves
    assert p.retime(2.5, 1.0) and p.done_at == pytest.approx(3.0)
    p.finish()
    assert p.busy_s == pytest.approx(3.0)  # wall seconds computing
    p.add(PrefillJob(1, 100, NO_HIT, 1.0, 1.0), now=5.0)
    assert p.done_at == 6.0


def _loads(queued: list[int]) -> list[InstanceLoad]:
    return [InstanceLoad(id=f"p{i}", role="prefill", queued_tokens=q) for i, q in enumerate(queued)]


def test_routers():
    loads = _loads([500, 100, 300])
    assert prefill_router("least-loaded", lambda u, c: 1.0)(2_000, 0, loads, 0.0) == ("p1", 0)
    rr = prefill_router("round-robin", lambda u, c: 1.0)
    assert [rr(20_000, 0, loads, 0.0) for _ in range(4)] == [("p0", 1), ("p1", 1), ("p2", 1), ("p0", 1)]
    assert prefill_router("bucketed", lambda u, c: float(u))(300_000, 0, loads, 0.0)[1] == 3
    with pytest.raises(ValueError, match="unknown prefill router"):
        prefill_router("hash", lambda u, c: 1.0)
