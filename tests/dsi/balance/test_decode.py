"""Decode bands and scores: the threshold rule, band counts and their hysteresis, band movement
as the mix changes, drained and full instances, spilling, and the overload guarantee."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsi.balance import DecodeBalancer, DecodeBalancerConfig, InstanceLoad, NoInstance
from dsi.balance.decode import DecodeBands, choose, long_threshold, overloaded_after, plan_bands

CFG = DecodeBalancerConfig()


def _d(name, running=0, kv=0, state="serving", slots=64, capacity=1_000_000, queued=0):
    return InstanceLoad(
        id=name,
        role="decode",
        state=state,
        queued_tokens=queued,
        running_requests=running,
        kv_tokens=kv,
        max_requests=slots,
        kv_capacity_tokens=capacity,
    )


def _idle(n, **kw):
    return [_d(f"d{i}", **kw) for i in range(n)]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("window", 0),
        ("min_samples", 300),
        ("long_min_tokens", 0),
        ("band_ratio", 0.5),
        ("request_kv_tokens", -1),
        ("hysteresis", 1.0),
        ("overload", 0.0),
    ],
)
def test_config_refuses_bad_values(field, value):
    with pytest.raises(ValueError, match=field):
        DecodeBalancerConfig(**{field: value})


def test_threshold_splits_the_mix_where_log_lengths_separate():
    assert long_threshold([1_000] * 100 + [20_000] * 10, CFG) == 20_000
    assert long_threshold([1_000] * 15, CFG) is None  # fewer than min_samples
    assert long_threshold([20_000] * 40, CFG) is None  # one length, one band
    assert long_threshold([1_000] * 100 + [3_000] * 10, CFG) is None  # raised to 8,192: nothing is long
    # 2,000 splits best from 500, then the floor lifts the threshold to 8,192
    assert long_threshold([500] * 100 + [2_000] * 10 + [9_000], CFG) == 8_192
    # groups closer than band_ratio (4x) are not split
    low_floor = DecodeBalancerConfig(long_min_tokens=1)
    assert long_threshold([1_000] * 100 + [5_000] * 10, low_floor) == 5_000
    assert long_threshold([1_000] * 100 + [3_000] * 10, low_floor) is None


def test_bands_move_with_the_mix():
    b = DecodeBalancer(DecodeBalancerConfig(window=40, min_samples=8))
    pool = _idle(4)
    for k in [1_000] * 30 + [10_000] * 10:
        b.route(k, pool)
    assert b.bands.threshold == 10_000
    assert b.route(1_000, pool).band == "short" and b.route(10_000, pool).band == "long"
    # the mix shifts up (10K becomes the short traffic, 100K the long): the boundary follows
    for k in [10_000] * 30 + [100_000] * 10:
        b.route(k, pool)
    assert b.bands.threshold == 100_000
    assert b.route(10_000, pool).band == "short" and b.route(100_000, pool).band == "long"


def test_band_movement_exact_assignments_on_idle_instances():
    b = DecodeBalancer(DecodeBalancerConfig(window=40, min_samples=8))
    pool = _idle(4)
    for k in [1_000] * 30 + [10_000] * 10:
        b.route(k, pool)
    assert (b.bands.threshold, b.bands.long, round(b.bands.share, 3)) == (10_000, ("d0", "d1", "d2"), 0.7)
    assert (b.route(1_000, pool).instance, b.route(10_000, pool).instance) == ("d3", "d0")
    # the mix moves up tenfold: the boundary follows, the long instances stay long through the
    # re-plans on the way (step 4), and a 10K request that was long is now short (on d3)
    for k in [10_000] * 30 + [100_000] * 10:
        b.route(k, pool)
    assert (b.bands.threshold, b.bands.long) == (100_000, ("d0", "d1", "d2"))
    assert (b.route(10_000, pool).instance, b.route(100_000, pool).instance) == ("d3", "d0")


def test_long_band_size_follows_its_kv_share_with_hysteresis():
    # mean KV per request: d2 50,000 > d3 2,000 > d1 1,000 > d0 500
    pool = [_d("d0", 1, 500), _d("d1", 1, 1_000), _d("d2", 1, 50_000), _d("d3", 1, 2_000)]
    mix_a = [1_000] * 38 + [10_000] * 2  # long share 20/58 = 0.345: floor(4 * 0.345 + 0.5) = 1
    a = plan_bands(mix_a, pool, None, CFG)
    assert (a.threshold, a.long, round(a.share, 3)) == (10_000, ("d2",), 0.345)
    mix_small = [1_000] * 36 + [10_000] * 2 + [1_500] * 2  # share 0.339: moved 0.006, kept
    assert plan_bands(mix_small, pool, a, CFG) == a
    mix_b = [1_000] * 30 + [10_000] * 10  # share 0.769: moved 0.42 > 0.1
    b = plan_bands(mix_b, pool, a, CFG)
    assert (b.long, round(b.share, 3)) == (("d1", "d2", "d3"), 0.769)  # d2 stays, then by mean KV
    # the short band always keeps an instance; a band worth under half an instance gets none
    assert plan_bands([1_000] * 10 + [100_000] * 30, pool, None, CFG).long == ("d1", "d2", "d3")
    tiny = plan_bands([1_000] * 200 + [10_000] * 2, pool, None, CFG)
    assert tiny.threshold == 10_000 and tiny.long == ()
    # request_kv_tokens weighs requests too: the same mix with 50,000 tokens per request
    weighted = plan_bands(mix_b, pool, None, DecodeBalancerConfig(request_kv_tokens=50_000))
    assert round(weighted.share, 3) == 0.282 and weighted.long == ("d2",)  # 600K / 2,130K


def test_a_changed_instance_set_redoes_the_bands_at_once():
    pool = _idle(4)
    a = plan_bands([1_000] * 38 + [10_000] * 2, pool, None, CFG)
    assert a.long == ("d0",)
    b = plan_bands([1_000] * 38 + [10_000] * 2, pool[1:], a, CFG)
    assert b.long == ("d1",)


def test_score_counts_requests_and_kv_against_capacity():
    pool = [_d("d0", running=10, kv=10_000), _d("d1", running=2, kv=600_000)]
    d = choose(1_000, pool, DecodeBands(None, (), 0.0), CFG)
    assert (d.instance, d.band, d.score) == ("d0", "one", 11 / 64)  # d1's KV score is 0.601


def test_a_colocated_request_goes_to_the_shortest_prompt_queue_then_by_score():
    """Two decodes that compute their requests' prompts: the one with 2,000 prompt tokens queued
    has the lower score, yet a colocated request's first token would wait for that queue."""
    bands = DecodeBands(None, (), 0.0)
    pool = [_d("d0", running=1, kv=2_000, queued=2_000), _d("d1", running=3, kv=9_000, queued=0)]
    assert choose(500, pool, bands, CFG).instance == "d0"  # handed over: by score, as before
    assert choose(500, pool, bands, CFG, colocated=True).instance == "d1"
    even = [_d("d0", running=1, kv=2_000, queued=300), _d("d1", running=3, kv=9_000, queued=300)]
    assert choose(500, even, bands, CFG, colocated=True).instance == "d0"  # equal queues: by score
    # a full instance stays out, and an overloaded one takes a colocated request only if all are
    full = [_d("d0", running=64, queued=0), _d("d1", running=3, queued=5_000)]
    assert choose(500, full, bands, CFG, colocated=True).instance == "d1"
    hot = [_d("d0", running=58, queued=0), _d("d1", running=3, queued=5_000)]  # d0: 59 / 64 > 0.9
    assert choose(500, hot, bands, CFG, colocated=True).instance == "d1"
    assert DecodeBalancer(CFG).route(500, pool, colocated=True).instance == "d1"


def test_drained_and_full_instances_are_excluded():
    bands = DecodeBands(None, (), 0.0)
    pool = [_d("d0", state="draining"), _d("d1", running=64), _d("d2", kv=999_500), _d("d3", running=30)]
    assert choose(1_000, pool, bands, CFG).instance == "d3"
    assert choose(400, pool[:3], bands, CFG).instance == "d2"  # 400 tokens still fit on d2
    with pytest.raises(NoInstance, match="room for 1000"):
        choose(1_000, pool[:3], bands, CFG)
    with pytest.raises(NoInstance):
        DecodeBalancer(CFG).route(1_000, [_d("d0", state="draining")])


def test_a_request_spills_out_of_its_band_rather_than_overload():
    bands = DecodeBands(10_000, ("d0", "d1"), 0.5)
    pool = [_d("d0", 4, 100_000), _d("d1", 3, 120_000), _d("d2", 57, 80_000), _d("d3", 60, 80_000)]
    d = choose(1_000, pool, bands, CFG)  # d2 would hold 58 / 64 = 0.906 > 0.9
    assert (d.instance, d.band, d.spilled, d.score) == ("d0", "short", True, 0.101)
    calm = [_d("d0", 4, 100_000), _d("d1", 3, 120_000), _d("d2", 50, 80_000), _d("d3", 60, 80_000)]
    assert choose(1_000, calm, bands, CFG).instance == "d2"  # 51 / 64 = 0.797: stays in its band
    assert choose(20_000, calm, bands, CFG).instance == "d0"  # long: lowest score of the long band


def test_every_eligible_instance_overloaded_then_the_lowest_score():
    pool = [_d("d0", 60), _d("d1", 59)]
    d = choose(1_000, pool, DecodeBands(None, (), 0.0), CFG)
    assert d.instance == "d1" and overloaded_after(pool[1], 1_000, CFG)


instance = st.builds(
    lambda i, running, kv, state, slots, capacity: _d(
        f"d{i}", min(running, slots), min(kv, capacity), state, slots, capacity
    ),
    st.integers(0, 9),
    st.integers(0, 16),
    st.integers(0, 100_000),
    st.sampled_from(["serving", "draining"]),
    st.integers(1, 16),
    st.integers(1_000, 100_000),
)


@settings(max_examples=300)
@given(
    st.lists(instance, min_size=1, max_size=6, unique_by=lambda i: i.id),
    st.integers(1, 60_000),
    st.integers(1, 60_000),
    st.sets(st.integers(0, 9)),
    st.floats(0.05, 1.0),
)
def test_a_placement_overloads_only_when_every_choice_would(pool, kv, threshold, long_ids, overload):
    cfg = DecodeBalancerConfig(overload=overload)
    bands = DecodeBands(threshold, tuple(sorted(f"d{i}" for i in long_ids)), 0.5)
    eligible = [
        i
        for i in pool
        if i.serving and i.running_requests < i.max_requests and i.kv_tokens + kv <= i.kv_capacity_tokens
    ]
    if not eligible:
        with pytest.raises(NoInstance):
            choose(kv, pool, bands, cfg)
        return
    d = choose(kv, pool, bands, cfg)
    chosen = next(i for i in pool if i.id == d.instance)
    assert chosen in eligible
    if overloaded_after(chosen, kv, cfg):
        assert all(overloaded_after(i, kv, cfg) for i in eligible)
        assert not any(i.running_requests == 0 for i in eligible)


@settings(max_examples=200)
@given(
    st.lists(st.integers(1, 300_000), min_size=1, max_size=120),
    st.integers(2, 6),
    st.integers(0, 2),
    st.floats(0.3, 1.0),
)
def test_no_instance_overloaded_while_another_idles(lengths, n, draining, overload):
    """Arrivals only (requests never leave), equal capacities: after every placement, no serving
    instance is overloaded while another serving instance holds nothing. (A departure can empty
    an instance beside an overloaded one; no balancer decision is involved in that.)"""
    cfg = DecodeBalancerConfig(window=32, min_samples=4, long_min_tokens=1_000, overload=overload)
    balancer = DecodeBalancer(cfg)
    state = {f"d{i}": (0, 0) for i in range(n + draining)}
    gone = {f"d{n + i}" for i in range(draining)}

    def pool():
        return [
            _d(name, r, kv, "draining" if name in gone else "serving", 16, 1_000_000)
            for name, (r, kv) in state.items()
        ]

    for k in lengths:
        try:
            d = balancer.route(k, pool())
        except NoInstance:
            continue
        r, kv = state[d.instance]
        state[d.instance] = (r + 1, kv + k)
        live = [i for i in pool() if i.serving]
        overloaded = [
            i
            for i in live
            if i.running_requests >= 2 and max(i.running_requests / 16, i.kv_tokens / 1_000_000) > overload
        ]
        assert not (overloaded and any(i.running_requests == 0 for i in live))
