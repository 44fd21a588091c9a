"""The policy stepped over a load ramp: decode scales 1 -> 3 and back, one instance per interval."""

from __future__ import annotations

import pytest

from dsi.autoscale import AutoscalerConfig, RoleBounds, simulate

CONFIG = AutoscalerConfig(
    prefill=RoleBounds(min_instances=1, max_instances=2),
    decode=RoleBounds(min_instances=1, max_instances=4, max_change=1, margin=0.25, ready_pool=1),
    interval_s=30.0,
)
# Active decode requests per 30 s interval; 16 per instance, so 30 (37.5 with the margin) needs 3.
RAMP = [4, 4, 30, 30, 30, 30, 0, 0, 0, 0]


def test_load_ramp_scales_decode_from_1_to_3_and_back_within_the_rate_limit():
    decisions = simulate(
        CONFIG,
        [(0.0, active) for active in RAMP],
        prefill_capacity=1000.0,
        decode_capacity=16.0,
        start_delay_s=45.0,
    )
    rows = [
        (
            d.inputs.now_s,
            d.inputs.decode.serving,
            d.inputs.decode.ready,
            d.inputs.decode.starting,
            d.decode.target,
            d.decode.take_from_pool,
            d.decode.start,
            d.decode.stop_serving,
        )
        for d in decisions
    ]
    assert rows == [
        # now  serving ready starting target take start stop
        (0.0, 1, 1, 0, 1, 0, 0, 0),
        (30.0, 1, 1, 0, 1, 0, 0, 0),
        (60.0, 1, 1, 0, 2, 1, 1, 0),  # burst: the pool serves at once, a start refills it
        (90.0, 2, 0, 1, 3, 0, 1, 0),  # pool empty: the shortfall waits for a start (45 s)
        (120.0, 2, 1, 1, 3, 1, 0, 0),  # the refill arrived and serves; the next refills the pool
        (150.0, 3, 1, 0, 3, 0, 0, 0),
        (180.0, 3, 1, 0, 2, 0, 0, 1),  # load stopped: down one per interval, the pool is full
        (210.0, 2, 1, 0, 1, 0, 0, 1),
        (240.0, 1, 1, 0, 1, 0, 0, 0),
        (270.0, 1, 1, 0, 1, 0, 0, 0),
    ]
    for d in decisions:
        assert abs(d.decode.target - d.inputs.decode.serving) <= CONFIG.decode.max_change
        assert d.prefill.target == 1


def test_started_instances_join_the_pool_only_after_the_start_delay():
    config = AutoscalerConfig(
        prefill=RoleBounds(min_instances=1, max_instances=2),
        decode=RoleBounds(min_instances=1, max_instances=8, max_change=4, ready_pool=0),
        interval_s=10.0,
    )
    decisions = simulate(
        config, [(0.0, 64.0)] * 5, prefill_capacity=1000.0, decode_capacity=16.0, start_delay_s=25.0
    )
    # 64 * 1.2 = 76.8 -> 5 instances; 4 started at 0 s are ready at 25 s, seen at 30 s.
    assert [
        (d.inputs.decode.serving, d.inputs.decode.ready, d.inputs.decode.starting) for d in decisions
    ] == [
        (1, 0, 0),
        (1, 0, 4),
        (1, 0, 4),
        (1, 4, 0),
        (5, 0, 0),
    ]


def test_negative_start_delay_is_refused():
    with pytest.raises(ValueError, match="start_delay_s must be a non-negative number of seconds, got -1"):
        simulate(CONFIG, [(0.0, 0.0)], prefill_capacity=1.0, decode_capacity=1.0, start_delay_s=-1)
