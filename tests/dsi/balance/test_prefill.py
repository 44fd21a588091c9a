"""Prefill buckets: edges, engines per bucket, neighbours sharing, hysteresis, drained engines."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsi.balance import InstanceLoad, NoInstance, PrefillBalancer, PrefillBalancerConfig
from dsi.balance.prefill import plan_buckets

CFG = PrefillBalancerConfig()
TOKENS = PrefillBalancerConfig(half_life_s=1e12)  # loads practically never decay


def _engines(n, **queued):
    return [InstanceLoad(id=f"p{i}", role="prefill", queued_tokens=queued.get(f"p{i}", 0)) for i in range(n)]


def _by_tokens(cfg=TOKENS):
    """A balancer whose cost is the un-cached token count, so shares are easy to write down."""
    return PrefillBalancer(cfg, cost=lambda uncached, cached: float(uncached))


def _feed(balancer, engines, now, tokens, count):
    for _ in range(count):
        balancer.route(tokens, 0, engines, now)


def test_bucket_edges_exactly_16k_is_in_the_second_bucket():
    assert [CFG.bucket_of(u) for u in (1, 16_383, 16_384, 65_535, 65_536, 262_143, 262_144, 10**7)] == [
        0,
        0,
        1,
        1,
        2,
        2,
        3,
        3,
    ]
    two = PrefillBalancerConfig(edges=(1_000,))
    assert (two.buckets, two.bucket_of(999), two.bucket_of(1_000)) == (2, 0, 1)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("edges", (), "edges"),
        ("edges", (64, 16), "edges"),
        ("edges", (0, 16), "edges"),
        ("rebalance_s", 0.0, "rebalance_s"),
        ("half_life_s", -1.0, "half_life_s"),
        ("hysteresis", 1.0, "hysteresis"),
        ("min_share", -0.1, "min_share"),
    ],
)
def test_config_refuses_bad_values(field, value, message):
    with pytest.raises(ValueError, match=message):
        PrefillBalancerConfig(**{field: value})


def test_engines_follow_the_compute_share_and_an_unloaded_bucket_borrows_its_neighbour():
    plan = plan_buckets([0.5, 0.3, 0.2, 0.0], _engines(4), None, CFG)
    assert plan.groups == ((0,), (1,), (2,))
    assert plan.engines == (("p0", "p1"), ("p2",), ("p3",))
    assert plan.group_of == (0, 1, 2, 2)  # >= 256K goes to the 64K-256K engine
    # a bucket between two loaded ones, at equal distance, goes to the longer one
    assert plan_buckets([0.5, 0.0, 0.5, 0.0], _engines(4), None, CFG).group_of == (0, 1, 1, 1)
    # with nothing measured every engine serves every bucket
    idle = plan_buckets([0.0] * 4, _engines(3), None, CFG)
    assert idle.engines == (("p0", "p1", "p2"),) and idle.group_of == (0, 0, 0, 0)


def test_a_bucket_under_min_share_has_no_engine_of_its_own():
    plan = plan_buckets([0.6, 0.395, 0.005, 0.0], _engines(4), None, CFG)
    assert plan.groups == ((0,), (1,)) and plan.group_of == (0, 1, 1, 1)


def test_fewer_engines_than_loaded_buckets_neighbours_share():
    plan = plan_buckets([0.4, 0.3, 0.2, 0.1], _engines(2), None, CFG)
    assert plan.groups == ((0,), (1, 2, 3)) and plan.engines == (("p0",), ("p1",))
    assert plan.group_of == (0, 1, 1, 1)
    one = plan_buckets([0.4, 0.3, 0.2, 0.1], _engines(1), None, CFG)
    assert one.groups == ((0, 1, 2, 3),) and one.engines == (("p0",),)
    with pytest.raises(NoInstance):
        plan_buckets([0.4, 0.3, 0.2, 0.1], [], None, CFG)


def test_least_queued_tokens_within_the_bucket():
    b = _by_tokens()
    idle = _engines(4)
    _feed(b, idle, 0.0, 1_000, 100)  # 100K in bucket 0
    _feed(b, idle, 0.0, 20_000, 20)  # 400K in bucket 1
    b.route(1_000, 0, idle, 10.0)  # the check at 10 s: shares 0.2016 / 0.7984 -> 1 + 3 engines
    assert b.plan.engines == (("p0",), ("p1", "p2", "p3"))
    busy = _engines(4, p0=50_000, p1=9_000, p2=3_000, p3=3_000)
    decision = b.route(20_000, 0, busy, 11.0)
    assert (decision.instance, decision.bucket) == ("p2", 1)  # p2 and p3 tie on tokens: the id
    assert b.route(1_000, 0, busy, 11.0).instance == "p0"  # bucket 0 has only p0, however busy


def test_hysteresis_no_change_below_the_threshold_change_above():
    b = _by_tokens()
    idle = _engines(4)
    _feed(b, idle, 0.0, 1_000, 100)
    _feed(b, idle, 0.0, 20_000, 20)
    b.route(1_000, 0, idle, 10.0)
    first = b.plan
    assert [round(s, 4) for s in first.shares[:2]] == [0.2016, 0.7984]
    # shares move to 0.2322 / 0.7678 (0.031 < 0.05): the check at 20 s keeps the plan
    _feed(b, idle, 19.0, 1_000, 19)
    b.route(1_000, 0, idle, 20.0)
    assert [round(s, 4) for s in b.shares(20.0)[:2]] == [0.2322, 0.7678]
    assert b.plan is first
    # load routed between checks is not acted on until the next check (30 s)
    queued = _engines(4, p1=5_000, p2=0, p3=7_000)
    _feed(b, queued, 25.0, 1_000, 280)
    assert b.plan is first
    # at 30 s bucket 0 holds 0.5012 (moved 0.30 > 0.05): 2 + 2 engines, and only the least
    # queued engine of bucket 1 (p2) moves
    b.route(1_000, 0, queued, 30.0)
    assert round(b.plan.shares[0], 4) == 0.5012
    assert b.plan.engines == (("p0", "p2"), ("p1", "p3"))


def test_measured_load_halves_every_half_life():
    b = _by_tokens(PrefillBalancerConfig(half_life_s=60.0))
    idle = _engines(2)
    b.route(30_000, 0, idle, 0.0)  # bucket 1
    b.route(1_000, 0, idle, 60.0)  # bucket 0; bucket 1's 30,000 now weighs 15,000
    assert b.shares(60.0)[:2] == pytest.approx((1 / 16, 15 / 16))


def test_a_drained_engine_is_replanned_away_at_once():
    b = _by_tokens()
    idle = _engines(4)
    _feed(b, idle, 0.0, 1_000, 100)
    _feed(b, idle, 0.0, 20_000, 20)
    b.route(1_000, 0, idle, 10.0)
    assert b.plan.engines == (("p0",), ("p1", "p2", "p3"))
    drained = [InstanceLoad(id="p0", role="prefill", state="draining"), *_engines(4, p1=4_000, p3=9_000)[1:]]
    decision = b.route(1_000, 0, drained, 11.0)  # before the next periodic check
    assert decision.instance == "p2" and "p0" not in b.plan.engine_ids
    assert b.plan.engines == (("p2",), ("p1", "p3"))  # the least queued engine of bucket 1 moved
    with pytest.raises(NoInstance):
        b.route(1_000, 0, [InstanceLoad(id="p0", role="prefill", state="draining")], 12.0)


def test_the_default_cost_is_the_flash_flop_estimate():
    b = PrefillBalancer(CFG)
    decision = b.route(16_384, 0, _engines(1), 0.0)
    assert decision.bucket == 1 and decision.flops == pytest.approx(2.358e14, rel=1e-3)


shares_4 = st.lists(st.sampled_from([0.0, 0.005, 0.02, 0.1, 0.3, 0.6, 1.0]), min_size=4, max_size=4)


@given(shares_4, st.integers(1, 10), st.lists(st.integers(0, 100_000), min_size=10, max_size=10))
def test_every_loaded_bucket_has_an_engine_while_engines_suffice(raw, n, queued):
    total = sum(raw)
    shares = [x / total if total else 0.0 for x in raw]
    engines = [InstanceLoad(id=f"p{i}", role="prefill", queued_tokens=queued[i]) for i in range(n)]
    plan = plan_buckets(shares, engines, None, CFG)
    loaded = [b for b, s in enumerate(shares) if s >= CFG.min_share]
    assert sorted(e for group in plan.engines for e in group) == sorted(e.id for e in engines)
    assert all(plan.engines_for(b) for b in range(4))
    if loaded and n >= len(loaded):
        assert plan.groups == tuple((b,) for b in loaded)
    elif loaded:
        assert len(plan.groups) == n and all(len(g) == 1 for g in plan.engines)
        assert [b for g in plan.groups for b in g] == loaded  # runs of neighbours, in order
    # replanning the same shares from this plan moves no engine
    assert plan_buckets(shares, engines, plan, CFG).engines == plan.engines
