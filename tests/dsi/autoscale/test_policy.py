"""One test per rule of dsi.autoscale.policy, each with the exact decision it must give."""

from __future__ import annotations

import doctest

import pytest

import dsi.autoscale.policy
from dsi.autoscale import RoleBounds, RoleDecision, Rule
from tests.dsi.autoscale.cases import decide_decode, without_reasons


def test_worked_example_in_the_docstring_is_exact():
    result = doctest.testmod(dsi.autoscale.policy, optionflags=doctest.ELLIPSIS)
    assert result.attempted == 4
    assert result.failed == 0


# --- bounds ---------------------------------------------------------------------------------


def test_min_keeps_instances_up_without_demand():
    bounds = RoleBounds(min_instances=2, max_instances=8, max_change=3)
    got = decide_decode(bounds, serving=2, capacity=16, demand=0).decode
    assert without_reasons(got) == RoleDecision(need=0, target=2)
    assert got.rules == (Rule.MIN,)
    assert str(got.reasons[0]) == "min: need 0 is below min_instances 2"


def test_below_min_is_raised_to_min():
    bounds = RoleBounds(min_instances=2, max_instances=8, max_change=3)
    got = decide_decode(bounds, serving=0, capacity=16, demand=0).decode
    assert without_reasons(got) == RoleDecision(need=0, target=2, shortfall=2, start=2, last_change_s=0.0)
    assert got.rules == (Rule.MIN,)


def test_max_caps_the_need():
    bounds = RoleBounds(max_instances=4, max_change=3)
    got = decide_decode(bounds, serving=3, capacity=16, demand=1000).decode
    # 1000 * 1.2 / 16 = 75 exactly: 76 are needed to exceed it.
    assert without_reasons(got) == RoleDecision(need=76, target=4, shortfall=1, start=1, last_change_s=0.0)
    assert got.rules == (Rule.MAX,)


def test_above_max_comes_back_within_the_rate_limit_despite_the_quota_rule():
    bounds = RoleBounds(max_instances=4, max_change=1)
    got = decide_decode(bounds, serving=6, capacity=16, demand=1000).decode
    assert without_reasons(got) == RoleDecision(need=76, target=5, stop_serving=1, last_change_s=0.0)
    assert got.rules == (Rule.MAX, Rule.RATE_LIMIT)


# --- rate limit -----------------------------------------------------------------------------


def test_rate_limit_up():
    bounds = RoleBounds(max_instances=10, max_change=2)
    got = decide_decode(bounds, serving=1, capacity=10, demand=41).decode  # 49.2 -> 5
    assert without_reasons(got) == RoleDecision(need=5, target=3, shortfall=2, start=2, last_change_s=0.0)
    assert got.rules == (Rule.RATE_LIMIT,)
    assert str(got.reasons[0]) == "rate_limit: 5 is 4 from serving 1, more than max_change 2: 3 this interval"


def test_rate_limit_down():
    bounds = RoleBounds(max_instances=10, max_change=2)
    got = decide_decode(bounds, serving=6, capacity=10, demand=0).decode
    assert without_reasons(got) == RoleDecision(need=0, target=4, stop_serving=2, last_change_s=0.0)
    assert got.rules == (Rule.MIN, Rule.RATE_LIMIT)


def test_cooldown_holds_a_second_change_within_one_interval():
    bounds = RoleBounds(max_instances=10, max_change=1)
    first = decide_decode(bounds, now_s=100.0, serving=1, capacity=10, demand=41)
    assert first.decode.target == 2
    early = decide_decode(bounds, now_s=110.0, previous=first, serving=2, capacity=10, demand=41).decode
    assert without_reasons(early) == RoleDecision(need=5, target=2, last_change_s=100.0)
    assert early.rules == (Rule.COOLDOWN,)
    late = decide_decode(bounds, now_s=129.6, previous=first, serving=2, capacity=10, demand=41).decode
    assert (late.target, late.rules) == (2, (Rule.COOLDOWN,))
    # 29.8 s is within the 1 % tolerance of a 30 s interval.
    on_time = decide_decode(bounds, now_s=129.8, previous=first, serving=2, capacity=10, demand=41).decode
    assert (on_time.target, on_time.last_change_s, on_time.rules) == (3, 129.8, (Rule.RATE_LIMIT,))


def test_cooldown_keeps_the_previous_target_so_a_shortfall_fills_as_instances_arrive():
    bounds = RoleBounds(max_instances=10, max_change=1, ready_pool=0)
    first = decide_decode(bounds, now_s=0.0, serving=2, capacity=10, demand=25)  # 30 -> 4, limited to 3
    assert without_reasons(first.decode) == RoleDecision(
        need=4, target=3, start=1, shortfall=1, last_change_s=0.0
    )
    # 10 s later the started instance is ready and demand has grown: the target stays 3, the
    # arrival serves at once.
    arrived = decide_decode(bounds, now_s=10.0, previous=first, serving=2, ready=1, capacity=10, demand=45)
    assert without_reasons(arrived.decode) == RoleDecision(
        need=6, target=3, take_from_pool=1, last_change_s=0.0
    )
    assert [str(reason) for reason in arrived.decode.reasons] == [
        "cooldown: target changed 10 s ago, less than the 30 s interval: holding 3 instead of 6"
    ]


def test_time_going_backwards_is_an_error():
    bounds = RoleBounds(max_instances=10)
    first = decide_decode(bounds, now_s=100.0, serving=1, capacity=10, demand=0)
    with pytest.raises(ValueError, match="before the previous decision"):
        decide_decode(bounds, now_s=99.0, previous=first, serving=1, capacity=10, demand=0)


# --- redundancy margin ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("demand", "margin", "need"),
    [
        (199, 0.0, 2),  # 2 * 100 > 199
        (200, 0.0, 3),  # exact multiple: 2 * 100 is not above 200
        (159, 0.25, 2),  # 198.75
        (160, 0.25, 3),  # 200.0 exactly
        (1, 0.0, 1),
        (0, 0.5, 0),  # no demand, no need; min_instances keeps one up
    ],
)
def test_margin_capacity_strictly_exceeds_demand_plus_margin(demand, margin, need):
    bounds = RoleBounds(min_instances=1, max_instances=10, max_change=10, margin=margin)
    got = decide_decode(bounds, serving=need or 1, capacity=100, demand=demand).decode
    assert got.need == need
    assert got.target == max(need, 1)
    if demand:
        assert got.target * 100 > demand * (1 + margin)
        assert (got.target - 1) * 100 <= demand * (1 + margin)


def test_margin_exact_decision_on_an_exact_multiple():
    bounds = RoleBounds(min_instances=1, max_instances=10, max_change=2, margin=0.25)
    got = decide_decode(bounds, serving=2, capacity=100, demand=160).decode  # 200 tokens/s needed
    # 2 * 100 equals 160 * 1.25 and does not exceed it: one more.
    assert without_reasons(got) == RoleDecision(need=3, target=3, start=1, shortfall=1, last_change_s=0.0)
    assert got.rules == ()


# --- quota rule -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("serving", "target", "rules"),
    [
        (81, 81, (Rule.MIN, Rule.QUOTA)),  # 0.81 > 0.8: held
        (80, 75, (Rule.MIN, Rule.RATE_LIMIT)),  # exactly 0.8 is not above it: allowed
        (79, 74, (Rule.MIN, Rule.RATE_LIMIT)),
    ],
)
def test_no_scale_down_while_quota_use_is_above_the_threshold(serving, target, rules):
    bounds = RoleBounds(max_instances=100, max_change=5)
    got = decide_decode(bounds, serving=serving, capacity=10, demand=0).decode
    assert (got.target, got.stop_serving, got.rules) == (target, serving - target, rules)


def test_quota_rule_exact_decision_holds_serving_and_stops_nothing():
    bounds = RoleBounds(min_instances=1, max_instances=10, max_change=3, ready_pool=1)
    got = decide_decode(bounds, serving=9, ready=1, capacity=10, demand=0).decode  # use 0.9
    assert without_reasons(got) == RoleDecision(need=0, target=9, pool_target=1)
    assert got.rules == (Rule.MIN, Rule.QUOTA)


def test_quota_rule_reason_names_the_use():
    bounds = RoleBounds(max_instances=100, max_change=5)
    got = decide_decode(bounds, serving=81, capacity=10, demand=0).decode
    assert str(got.reasons[1]) == "quota: quota use 81/100 = 0.81 is above 0.8: holding 81 instead of 1"


def test_quota_rule_keeps_ready_instances_above_the_pool_target():
    bounds = RoleBounds(max_instances=10, ready_pool=0)
    held = decide_decode(bounds, serving=9, ready=1, capacity=10, demand=80).decode  # need 10, use 0.9
    assert without_reasons(held) == RoleDecision(need=10, target=10, take_from_pool=1, last_change_s=0.0)
    held = decide_decode(bounds, serving=9, ready=1, capacity=10, demand=70).decode  # need 9
    assert without_reasons(held) == RoleDecision(need=9, target=9)
    assert [str(reason) for reason in held.reasons] == ["quota: keeping 1 ready above the pool target"]
    free = decide_decode(bounds, serving=7, ready=1, capacity=10, demand=50).decode  # need 7, use 0.7
    assert without_reasons(free) == RoleDecision(need=7, target=7, stop_ready=1)
    assert free.rules == ()


# --- ready pool -----------------------------------------------------------------------------


def test_ready_pool_is_used_first_on_a_burst_and_refilled_afterwards():
    bounds = RoleBounds(max_instances=10, max_change=4, ready_pool=2)
    # need 5 (41 * 1.2 = 49.2); the pool holds 2 of the 3 more.
    burst = decide_decode(bounds, now_s=0.0, serving=2, ready=2, capacity=10, demand=41)
    assert without_reasons(burst.decode) == RoleDecision(
        need=5, target=5, take_from_pool=2, start=3, pool_target=2, shortfall=1, last_change_s=0.0
    )
    # The 3 are still starting: nothing more is started.
    waiting = decide_decode(bounds, now_s=30.0, previous=burst, serving=4, starting=3, capacity=10, demand=41)
    assert without_reasons(waiting.decode) == RoleDecision(
        need=5, target=5, take_from_pool=0, pool_target=2, shortfall=1, last_change_s=0.0
    )
    # They are ready: one serves, two refill the pool.
    arrived = decide_decode(bounds, now_s=60.0, previous=waiting, serving=4, ready=3, capacity=10, demand=41)
    assert without_reasons(arrived.decode) == RoleDecision(
        need=5, target=5, take_from_pool=1, pool_target=2, last_change_s=0.0
    )


def test_scale_down_returns_serving_instances_to_a_short_pool():
    bounds = RoleBounds(max_instances=10, max_change=3, ready_pool=2)
    got = decide_decode(bounds, serving=5, ready=1, capacity=10, demand=0).decode
    assert without_reasons(got) == RoleDecision(
        need=0, target=2, return_to_pool=1, stop_serving=2, pool_target=2, last_change_s=0.0
    )


def test_scale_down_keeps_warm_instances_while_others_are_starting():
    bounds = RoleBounds(max_instances=10, max_change=1, ready_pool=1)
    got = decide_decode(bounds, serving=3, starting=1, capacity=10, demand=0).decode
    # The starting instance would refill the pool later; the warm one refills it now.
    assert without_reasons(got) == RoleDecision(
        need=0, target=2, return_to_pool=1, pool_target=1, last_change_s=0.0
    )


def test_pool_target_is_cut_so_the_role_stays_within_max():
    bounds = RoleBounds(max_instances=6, max_change=5, ready_pool=2)
    got = decide_decode(bounds, serving=5, capacity=10, demand=41).decode  # need 5
    assert without_reasons(got) == RoleDecision(need=5, target=5, start=1, pool_target=1)
    assert got.rules == (Rule.POOL_QUOTA,)


def test_starts_never_exceed_max_held():
    bounds = RoleBounds(max_instances=6, max_change=5, ready_pool=2)
    got = decide_decode(bounds, serving=1, starting=3, capacity=10, demand=1000).decode
    # target 6 (max), pool 0; 3 are starting, so 2 more fill the quota.
    assert without_reasons(got) == RoleDecision(need=121, target=6, start=2, shortfall=5, last_change_s=0.0)
    assert got.rules == (Rule.MAX, Rule.POOL_QUOTA)


# --- operator target ------------------------------------------------------------------------


def test_a_manual_target_replaces_the_need_and_keeps_the_rate_limit():
    bounds = RoleBounds(min_instances=1, max_instances=10, max_change=1, ready_pool=1)
    got = decide_decode(bounds, serving=1, ready=1, capacity=10, demand=0, manual=4).decode
    assert without_reasons(got) == RoleDecision(
        need=0, target=2, take_from_pool=1, start=1, pool_target=1, last_change_s=0.0
    )
    assert [str(reason) for reason in got.reasons] == [
        "min: need 0 is below min_instances 1",
        "manual: operator target 4 instead of 1",
        "rate_limit: 4 is 3 from serving 1, more than max_change 1: 2 this interval",
    ]
    # Outside the bounds (the config changed since): clamped.
    got = decide_decode(bounds, serving=2, capacity=10, demand=0, manual=20).decode
    assert (got.target, got.rules) == (3, (Rule.MIN, Rule.MANUAL, Rule.RATE_LIMIT))
