"""The autoscaler's decision for one interval: a pure function of the config, the inputs and the
previous decision.

Per role (prefill from un-cached tokens/s, decode from active requests), in this order:

1. need: the smallest n with n * capacity > demand * (1 + margin), so the serving capacity
   always strictly exceeds the demand plus its margin, also on an exact multiple; 0 when there
   is no demand (see :func:`dsi.autoscale.need.instances_needed`).
2. bounds: clamp to [min_instances, max_instances]. An operator's target (``manual``, set by
   ``dsi scale``) then replaces it, clamped the same way; the rules below still apply to it.
3. cooldown: a role whose target changed less than interval_s ago (1 % tolerance for timer
   jitter) keeps its previous target (within the bounds), so calling more often than once per
   interval does not multiply the rate limit, and a shortfall still fills as instances arrive.
   A target changes when it differs from the previous decision's (from the serving count when
   there is none).
4. quota rule: while quota use = serving / max_instances is strictly above quota_threshold
   (0.8), the target does not go below min(serving, max_instances): no scale-down, but a role
   above its max still comes back within it. At exactly 0.8 scale-down is allowed.
5. rate limit: the target moves at most max_change from the serving count, up or down. A role
   outside its bounds reaches them over several intervals.
6. ready pool target: ready_pool, cut to max_instances - target, so that serving + ready never
   needs more than the role's quota.
7. moves:

   - scale-up takes ready instances first (instant); the rest is a shortfall, covered by
     instances already starting and then by new starts;
   - scale-down returns serving instances to the ready pool while it is below its target (warm
     instances are kept), and stops the rest;
   - starts: enough that ready + starting covers shortfall + pool target, never past
     max_instances held (serving + ready + starting);
   - ready instances above the pool target are stopped, unless the quota rule holds (then only
     what exceeds max_instances is stopped).

Starting instances are counted so nothing is started twice, but never to stop a warm instance:
the pool keeps its ready instances until the starting ones have arrived.

Worked example: prefill serves 2 instances of 10,000 un-cached tokens/s with one ready, and
41,000 tokens/s arrive; decode serves 4 instances of 16 active requests, 30 requests are active.

>>> from dsi.autoscale import AutoscalerConfig, RoleBounds, RoleInputs, ScalingInputs, decide
>>> config = AutoscalerConfig(
...     prefill=RoleBounds(min_instances=1, max_instances=8, max_change=2, margin=0.2, ready_pool=1),
...     decode=RoleBounds(min_instances=1, max_instances=6, max_change=1, margin=0.25, ready_pool=1),
... )
>>> inputs = ScalingInputs(
...     now_s=600.0,
...     prefill=RoleInputs(serving=2, ready=1, capacity=10_000, demand=41_000),
...     decode=RoleInputs(serving=4, capacity=16, demand=30),
... )
>>> print(decide(config, inputs).describe())
at 600 s
prefill: serving 2, ready 1, starting 0, demand 41000, capacity 10000
  need 5, target 4, take 1, start 2, pool target 1, shortfall 1
    rate_limit: 5 is 3 from serving 2, more than max_change 2: 4 this interval
decode: serving 4, ready 0, starting 0, demand 30, capacity 16
  need 3, target 3, return 1, pool target 1, shortfall 0

Prefill needs 5 (41,000 * 1.2 = 49,200 tokens/s; 4 * 10,000 would not exceed it), the rate
limit allows 4: the ready instance is taken at once, and 2 are started, one for the shortfall
and one to refill the pool. Decode needs 3 (30 * 1.25 = 37.5 < 3 * 16); quota use 4/6 = 0.67
allows the scale-down, and the released instance refills the empty pool instead of stopping.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsi.autoscale.config import SCALED_ROLES, AutoscalerConfig, RoleBounds, ScaledRole
from dsi.autoscale.decision import Decision, Reason, RoleDecision, Rule
from dsi.autoscale.inputs import RoleInputs, ScalingInputs
from dsi.autoscale.need import instances_needed

# Fraction of interval_s a call may come early and still count as a new interval (timer jitter).
COOLDOWN_TOLERANCE = 0.01


def decide(config: AutoscalerConfig, inputs: ScalingInputs, previous: Decision | None = None) -> Decision:
    """Both roles' decisions at ``inputs.now_s``; ``previous`` is the last decision (None at start)."""
    if previous is not None and inputs.now_s < previous.inputs.now_s:
        raise ValueError(f"now_s {inputs.now_s} is before the previous decision's {previous.inputs.now_s}")
    roles = {name: _decide_role(config, name, inputs, previous) for name in SCALED_ROLES}
    return Decision(inputs=inputs, **roles)


@dataclass(slots=True, frozen=True)
class _Moves:
    take: int
    ret: int
    stop_serving: int
    stop_ready: int
    start: int
    shortfall: int


def _decide_role(
    config: AutoscalerConfig, name: ScaledRole, inputs: ScalingInputs, previous: Decision | None
) -> RoleDecision:
    bounds, seen = config.bounds(name), inputs.role(name)
    before = previous.role(name) if previous is not None else None
    quota_hold = seen.serving / bounds.max_instances > config.quota_threshold
    reasons: list[Reason] = []
    need = instances_needed(seen.demand, seen.capacity, bounds.margin)
    target = _bound(need, bounds, reasons)
    if seen.manual is not None:
        target = _manual(seen.manual, target, bounds, reasons)
    target = _cool_down(target, before, bounds, inputs.now_s, config.interval_s, reasons)
    if quota_hold:
        target = _hold_for_quota(target, seen, bounds, config.quota_threshold, reasons)
    target = _rate_limit(target, seen.serving, bounds.max_change, reasons)
    pool_target = _pool_target(target, bounds, reasons)
    moves = _moves(target, pool_target, seen, bounds, quota_hold, reasons)
    return RoleDecision(
        need=need,
        target=target,
        take_from_pool=moves.take,
        return_to_pool=moves.ret,
        stop_serving=moves.stop_serving,
        stop_ready=moves.stop_ready,
        start=moves.start,
        pool_target=pool_target,
        shortfall=moves.shortfall,
        last_change_s=_last_change_s(target, before, seen.serving, inputs.now_s),
        reasons=tuple(reasons),
    )


def _bound(need: int, bounds: RoleBounds, reasons: list[Reason]) -> int:
    if need < bounds.min_instances:
        reasons.append(Reason(Rule.MIN, f"need {need} is below min_instances {bounds.min_instances}"))
        return bounds.min_instances
    if need > bounds.max_instances:
        reasons.append(Reason(Rule.MAX, f"need {need} is above max_instances {bounds.max_instances}"))
        return bounds.max_instances
    return need


def _manual(manual: int, target: int, bounds: RoleBounds, reasons: list[Reason]) -> int:
    held = min(max(manual, bounds.min_instances), bounds.max_instances)
    reasons.append(Reason(Rule.MANUAL, f"operator target {held} instead of {target}"))
    return held


def _hold_for_quota(
    target: int, seen: RoleInputs, bounds: RoleBounds, threshold: float, reasons: list[Reason]
) -> int:
    floor = min(seen.serving, bounds.max_instances)
    if target >= floor:
        return target
    reasons.append(
        Reason(
            Rule.QUOTA,
            f"quota use {seen.serving}/{bounds.max_instances} = {seen.serving / bounds.max_instances:.2f} "
            f"is above {threshold:g}: holding {floor} instead of {target}",
        )
    )
    return floor


def _cool_down(
    target: int,
    before: RoleDecision | None,
    bounds: RoleBounds,
    now_s: float,
    interval_s: float,
    reasons: list[Reason],
) -> int:
    if before is None or before.last_change_s is None:
        return target
    waited_s = now_s - before.last_change_s
    if waited_s >= interval_s * (1.0 - COOLDOWN_TOLERANCE):
        return target
    held = min(max(before.target, bounds.min_instances), bounds.max_instances)
    if held != target:
        reasons.append(
            Reason(
                Rule.COOLDOWN,
                f"target changed {waited_s:g} s ago, less than the {interval_s:g} s interval: "
                f"holding {held} instead of {target}",
            )
        )
    return held


def _last_change_s(target: int, before: RoleDecision | None, serving: int, now_s: float) -> float | None:
    """Now if the target changed: from the previous target, or from the serving count at start."""
    if before is None:
        return now_s if target != serving else None
    return now_s if target != before.target else before.last_change_s


def _rate_limit(target: int, serving: int, max_change: int, reasons: list[Reason]) -> int:
    limited = min(max(target, serving - max_change), serving + max_change)
    if limited != target:
        reasons.append(
            Reason(
                Rule.RATE_LIMIT,
                f"{target} is {abs(target - serving)} from serving {serving}, more than max_change "
                f"{max_change}: {limited} this interval",
            )
        )
    return limited


def _pool_target(target: int, bounds: RoleBounds, reasons: list[Reason]) -> int:
    pool = min(bounds.ready_pool, max(0, bounds.max_instances - target))
    if pool < bounds.ready_pool:
        reasons.append(
            Reason(
                Rule.POOL_QUOTA,
                f"ready pool {pool} instead of {bounds.ready_pool}: target {target} + pool "
                f"stays within max_instances {bounds.max_instances}",
            )
        )
    return pool


def _moves(
    target: int, pool: int, seen: RoleInputs, bounds: RoleBounds, quota_hold: bool, reasons: list[Reason]
) -> _Moves:
    # Step 1: serving count, from the pool first; a scale-down refills the pool before stopping.
    take = min(max(target - seen.serving, 0), seen.ready)
    down = max(seen.serving - target, 0)
    ret = min(down, max(0, pool - seen.ready))
    serving, ready = seen.serving + take - down, seen.ready - take + ret
    shortfall = target - serving
    # Step 2: starts cover the shortfall and the pool, counting what is already starting.
    wanted = shortfall + pool - ready - seen.starting
    start = max(0, min(wanted, bounds.max_instances - (serving + ready + seen.starting)))
    # Step 3: ready instances beyond the pool; the quota rule keeps all but those over max.
    spare = ready - pool
    if quota_hold and spare > 0:
        over = serving + ready + seen.starting - bounds.max_instances
        if over < spare:
            reasons.append(Reason(Rule.QUOTA, f"keeping {spare - max(over, 0)} ready above the pool target"))
        spare = min(spare, over)
    stop_ready = min(max(spare, 0), ready)
    return _Moves(take, ret, down - ret, stop_ready, start, shortfall)
