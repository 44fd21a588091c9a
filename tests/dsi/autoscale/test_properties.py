"""For random bounds, inputs and previous decisions, every decision keeps the policy's invariants."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dsi.autoscale import (
    AutoscalerConfig,
    Decision,
    RoleBounds,
    RoleDecision,
    RoleInputs,
    Rule,
    ScalingInputs,
    decide,
)
from dsi.autoscale.need import instances_needed, required_capacity
from dsi.autoscale.policy import COOLDOWN_TOLERANCE

NOW_S = 1000.0


@st.composite
def role_bounds(draw: st.DrawFn) -> RoleBounds:
    low = draw(st.integers(0, 20))
    high = draw(st.integers(max(low, 1), 40))
    return RoleBounds(
        min_instances=low,
        max_instances=high,
        max_change=draw(st.integers(1, 6)),
        margin=draw(st.sampled_from([0.0, 0.1, 0.2, 0.25, 0.5, 1.0]) | st.floats(0.0, 2.0)),
        ready_pool=draw(st.integers(0, high)),
    )


@st.composite
def role_inputs(draw: st.DrawFn) -> RoleInputs:
    capacity = draw(st.sampled_from([1.0, 10.0, 16.0, 100.0, 10_000.0]) | st.floats(0.5, 1e5))
    # Whole multiples of the capacity hit the edge where ceil() would leave no headroom.
    demand = draw(
        st.integers(0, 50).map(lambda k: k * capacity) | st.floats(0.0, 60.0).map(lambda x: x * capacity)
    )
    return RoleInputs(
        serving=draw(st.integers(0, 50)),
        ready=draw(st.integers(0, 10)),
        starting=draw(st.integers(0, 10)),
        capacity=capacity,
        demand=demand,
    )


def previous_at(last_change_s: float, targets: tuple[int, int]) -> Decision:
    idle = RoleInputs(serving=0, capacity=1.0, demand=0.0)
    earlier = ScalingInputs(now_s=0.0, prefill=idle, decode=idle)
    prefill, decode = (RoleDecision(need=0, target=t, last_change_s=last_change_s) for t in targets)
    return Decision(inputs=earlier, prefill=prefill, decode=decode)


@settings(max_examples=400, deadline=None)
@given(
    prefill=role_bounds(),
    decode=role_bounds(),
    seen_prefill=role_inputs(),
    seen_decode=role_inputs(),
    threshold=st.sampled_from([0.5, 0.8, 1.0]),
    since_change_s=st.none() | st.sampled_from([0.0, 15.0, 29.6, 29.7, 30.0]) | st.floats(0.0, 120.0),
    last_targets=st.tuples(st.integers(0, 50), st.integers(0, 50)),
)
def test_invariants_hold_for_random_inputs(
    prefill, decode, seen_prefill, seen_decode, threshold, since_change_s, last_targets
):
    config = AutoscalerConfig(prefill=prefill, decode=decode, quota_threshold=threshold)
    inputs = ScalingInputs(now_s=NOW_S, prefill=seen_prefill, decode=seen_decode)
    previous = None if since_change_s is None else previous_at(NOW_S - since_change_s, last_targets)
    decision = decide(config, inputs, previous)
    cooling = since_change_s is not None and since_change_s < config.interval_s * (1 - COOLDOWN_TOLERANCE)
    for name in ("prefill", "decode"):
        held = previous.role(name).target if cooling else None
        check_role(config.bounds(name), inputs.role(name), decision.role(name), threshold, held)


def check_role(
    bounds: RoleBounds, seen: RoleInputs, got: RoleDecision, threshold: float, held: int | None
) -> None:
    low, high, step = bounds.min_instances, bounds.max_instances, bounds.max_change
    cooling = held is not None
    # Rate limit; in a cooldown the previous target stays unless the quota rule or the rate limit moved it.
    assert abs(got.target - seen.serving) <= step
    if cooling and not {Rule.QUOTA, Rule.RATE_LIMIT} & set(got.rules):
        assert got.target == min(max(held, low), high)
    # Bounds: inside stays inside; outside moves towards them.
    if low <= seen.serving <= high:
        assert low <= got.target <= high
    assert min(seen.serving, low) <= got.target <= max(seen.serving, high)
    # Capacity strictly above demand * (1 + margin), whenever max and the rate limit allow it.
    required = required_capacity(seen.demand, bounds.margin)
    assert got.need == instances_needed(seen.demand, seen.capacity, bounds.margin)
    if seen.demand > 0:
        assert got.need * seen.capacity > required >= (got.need - 1) * seen.capacity
    if seen.demand > 0 and not cooling and got.target * seen.capacity <= required:
        assert got.target >= high or got.target == seen.serving + step  # held by max or the rate limit
    # Quota rule: nothing shrinks or stops while use is above the threshold, but for what is over max.
    if seen.serving / high > threshold:
        assert got.target >= min(seen.serving, high)
        assert got.return_to_pool == 0
        assert got.stop_ready <= max(0, seen.held - high)
    check_moves(bounds, seen, got, threshold)


def check_moves(bounds: RoleBounds, seen: RoleInputs, got: RoleDecision, threshold: float) -> None:
    counts = (
        got.take_from_pool,
        got.return_to_pool,
        got.stop_serving,
        got.stop_ready,
        got.start,
        got.shortfall,
    )
    assert min(counts) >= 0
    assert not (got.take_from_pool and (got.return_to_pool or got.stop_serving))
    assert not (got.return_to_pool and got.stop_ready)  # a return only fills the pool's gap
    assert got.take_from_pool <= seen.ready
    serving = seen.serving + got.take_from_pool - got.return_to_pool - got.stop_serving
    ready = seen.ready - got.take_from_pool + got.return_to_pool - got.stop_ready
    assert serving >= 0 and ready >= 0
    assert serving + got.shortfall == got.target
    if seen.serving / bounds.max_instances <= threshold:
        assert ready <= got.pool_target  # spare ready instances are stopped
    if got.shortfall:  # the pool is used up before anything is started for a burst
        assert got.take_from_pool == seen.ready
    assert got.pool_target <= min(bounds.ready_pool, max(0, bounds.max_instances - got.target))
    if got.start:
        assert serving + ready + seen.starting + got.start <= bounds.max_instances
        assert ready + seen.starting + got.start <= got.shortfall + got.pool_target
