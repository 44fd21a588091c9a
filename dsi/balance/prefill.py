"""Prefill balancer: length buckets by un-cached tokens, engines per bucket by measured compute.

A request goes to the bucket of its un-cached token count u: bucket i holds
``edges[i-1] <= u < edges[i]`` (default edges 16K, 64K, 256K: ``< 16,384``, ``16,384-65,535``,
``65,536-262,143``, ``>= 262,144``; exactly 16,384 is in bucket 1). Inside its bucket it goes to
the engine with the fewest queued un-cached tokens (ties: fewer running requests, then id).
There is no prefix affinity: every prefill reads every prefix from the shared store.

Which engines serve which bucket (a :class:`BucketPlan`):

1. Measured load: each routed request adds its FLOP estimate (:class:`PrefillCost`) to its
   bucket's load; every load halves each ``half_life_s`` seconds. share_b = load_b / sum(load).
2. A bucket is *loaded* when share_b >= ``min_share``. With E serving engines and L loaded
   buckets, E >= L: each loaded bucket is its own group; E < L: the loaded buckets are cut into E
   runs of neighbours whose heaviest run is lightest (neighbouring buckets share an engine).
3. Every group gets one engine, then each further engine goes to the group with the highest
   share per engine (:func:`apportion`): engines follow compute, and a loaded bucket always has
   one while E >= L.
4. Engines move as little as possible: an engine stays in the group it served (the busiest
   stay), the least queued ones move.
5. A bucket that is not loaded is served by the group of its nearest loaded bucket (ties: the
   longer one). With no load measured yet, every engine serves every bucket (least queued).

Hysteresis: every ``rebalance_s`` seconds the plan is checked and redone only when (a) the set
of serving engines changed, (b) the set of loaded buckets changed, or (c) some bucket's share
differs from its share when the plan was made by more than ``hysteresis`` (absolute, shares in
0..1). A change of the engine set is also acted on at once, at the next route.

Worked example: 8 idle engines; 70 requests at t = 0 (the plan made at the first one knows only
bucket 0, so every engine serves every bucket), one of 300K tokens at t = 10 s, the first check::

    >>> b = PrefillBalancer(PrefillBalancerConfig())
    >>> idle = [InstanceLoad(id=f"p{i}", role="prefill") for i in range(8)]
    >>> for u in [2_000] * 60 + [30_000] * 8 + [100_000] * 2:
    ...     _ = b.route(u, 0, idle, now=0.0)
    >>> b.route(300_000, 0, idle, now=10.0).bucket
    3
    >>> [round(s, 3) for s in b.plan.shares]
    [0.14, 0.266, 0.221, 0.373]
    >>> b.plan.engines
    (('p0',), ('p1', 'p2'), ('p3', 'p4'), ('p5', 'p6', 'p7'))
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from dsi.balance.cost import PrefillCost
from dsi.balance.load import InstanceLoad, NoInstance, serving
from dsi.balance.shares import apportion, moved, neighbour_groups, normalise


@dataclass(slots=True, frozen=True)
class PrefillBalancerConfig:
    edges: tuple[int, ...] = (16_384, 65_536, 262_144)  # un-cached tokens where buckets 1, 2, 3 start
    rebalance_s: float = 10.0  # seconds between checks of the plan
    half_life_s: float = 60.0  # seconds for a bucket's measured load to halve
    hysteresis: float = 0.05  # a share must move by more than this (absolute, of 1) to redo the plan
    min_share: float = 0.01  # a bucket below this share has no engine of its own

    def __post_init__(self) -> None:
        problems = []
        if not self.edges or any(e <= 0 for e in self.edges) or list(self.edges) != sorted(set(self.edges)):
            problems.append("edges must be increasing positive token counts")
        if self.rebalance_s <= 0 or self.half_life_s <= 0:
            problems.append("rebalance_s and half_life_s must be > 0")
        if not 0 <= self.hysteresis < 1 or not 0 <= self.min_share < 1:
            problems.append("hysteresis and min_share must be in [0, 1)")
        if problems:
            raise ValueError("prefill balancer config: " + "; ".join(problems))

    @property
    def buckets(self) -> int:
        return len(self.edges) + 1

    def bucket_of(self, uncached: int) -> int:
        """The bucket of a request with ``uncached`` tokens to compute."""
        return bisect.bisect_right(self.edges, uncached)


@dataclass(slots=True, frozen=True)
class BucketPlan:
    """Which engines serve which bucket."""

    shares: tuple[float, ...]  # [bucket] compute share (0..1) the plan was made from
    groups: tuple[tuple[int, ...], ...]  # runs of neighbouring buckets served together
    engines: tuple[tuple[str, ...], ...]  # [group] engine ids, ordered
    group_of: tuple[int, ...]  # [bucket] the group that serves it

    def engines_for(self, bucket: int) -> tuple[str, ...]:
        return self.engines[self.group_of[bucket]]

    @property
    def engine_ids(self) -> frozenset[str]:
        return frozenset(e for group in self.engines for e in group)


@dataclass(slots=True, frozen=True)
class PrefillDecision:
    instance: str
    bucket: int
    flops: float  # the request's estimated cost, FLOPs


def least_queued(engines: Sequence[InstanceLoad], chosen: Collection[str]) -> InstanceLoad:
    """The engine of ``chosen`` with the fewest queued un-cached tokens (ties: fewer running
    requests, then id); ``engines`` are the serving ones."""
    return min(
        (e for e in engines if e.id in chosen), key=lambda e: (e.queued_tokens, e.running_requests, e.id)
    )


def plan_buckets(
    shares: Sequence[float],
    engines: Sequence[InstanceLoad],
    previous: BucketPlan | None,
    cfg: PrefillBalancerConfig,
) -> BucketPlan:
    """The plan for compute ``shares`` per bucket over the serving ``engines`` (steps 2-5 of the
    module docstring); ``previous`` keeps engines where they were."""
    ids = [e.id for e in sorted(engines, key=lambda e: e.id)]
    if not ids:
        raise NoInstance("no serving prefill instance")
    weights = [s if s >= cfg.min_share and s > 0 else 0.0 for s in shares]
    groups = neighbour_groups(weights, len(ids))
    if not groups:  # nothing measured: one group of every bucket
        return BucketPlan(tuple(shares), (tuple(range(len(shares))),), (tuple(ids),), (0,) * len(shares))
    counts = apportion([sum(weights[b] for b in g) for g in groups], len(ids))
    members = _place(groups, counts, engines, previous)
    return BucketPlan(tuple(shares), tuple(groups), members, _group_of(groups, len(shares)))


def _place(
    groups: list[tuple[int, ...]],
    counts: list[int],
    engines: Sequence[InstanceLoad],
    previous: BucketPlan | None,
) -> tuple[tuple[str, ...], ...]:
    # Step 4: stayers first (busiest keep their place), then the least queued free engines.
    was: dict[str, set[int]] = {}
    if previous is not None:
        for group, members in zip(previous.groups, previous.engines, strict=True):
            for e in members:
                was[e] = set(group)
    busiest = sorted(engines, key=lambda e: (-e.queued_tokens, e.id))
    taken: set[str] = set()
    placed: list[list[str]] = [[] for _ in groups]
    for g, group in enumerate(groups):
        for e in busiest:
            if len(placed[g]) < counts[g] and e.id not in taken and was.get(e.id, set()) & set(group):
                placed[g].append(e.id)
                taken.add(e.id)
    free = [e.id for e in sorted(engines, key=lambda e: (e.queued_tokens, e.id)) if e.id not in taken]
    for g in range(len(groups)):
        while len(placed[g]) < counts[g]:
            placed[g].append(free.pop(0))
    return tuple(tuple(sorted(p)) for p in placed)


def _group_of(groups: list[tuple[int, ...]], buckets: int) -> tuple[int, ...]:
    own = {b: g for g, group in enumerate(groups) for b in group}
    loaded = sorted(own)
    nearest = [min(loaded, key=lambda b2, b=b: (abs(b - b2), -b2)) for b in range(buckets)]
    return tuple(own[nearest[b]] for b in range(buckets))


class PrefillBalancer:
    """The bucket policy over time: measured loads, the current plan, and routing. No I/O; the
    caller passes the clock (``now``, seconds) and a fresh snapshot with each request."""

    def __init__(self, cfg: PrefillBalancerConfig, cost: Callable[[int, int], float] | None = None) -> None:
        self.cfg = cfg
        self.cost = cost or PrefillCost()
        self._loads = [0.0] * cfg.buckets  # decayed FLOPs per bucket, as of self._t
        self._t = 0.0
        self._next_check = 0.0
        self.plan: BucketPlan | None = None

    def shares(self, now: float) -> tuple[float, ...]:
        self._decay(now)
        return normalise(self._loads)

    def route(
        self, uncached: int, cached: int, instances: Sequence[InstanceLoad], now: float
    ) -> PrefillDecision:
        """The engine for a request with ``uncached`` tokens to compute after ``cached`` cached ones."""
        engines = serving(instances, "prefill")
        if not engines:
            raise NoInstance("no serving prefill instance")
        bucket = self.cfg.bucket_of(uncached)
        flops = self.cost(uncached, cached)
        self._decay(now)
        self._loads[bucket] += flops
        plan = self._check(engines, now)
        return PrefillDecision(least_queued(engines, plan.engines_for(bucket)).id, bucket, flops)

    def observe(self, uncached: int, cached: int, now: float) -> int:
        """Measure a request routed elsewhere (from a decision table made by :meth:`plan_for`):
        its FLOPs join its bucket's load. Returns its bucket."""
        bucket = self.cfg.bucket_of(uncached)
        self._decay(now)
        self._loads[bucket] += self.cost(uncached, cached)
        return bucket

    def plan_for(self, instances: Sequence[InstanceLoad], now: float) -> BucketPlan | None:
        """The plan to route by now over ``instances`` (re-checked as :meth:`route` does), or None
        when no prefill serves."""
        engines = serving(instances, "prefill")
        if not engines:
            return None
        self._decay(now)
        return self._check(engines, now)

    def _check(self, engines: list[InstanceLoad], now: float) -> BucketPlan:
        """The plan to route by: redone when the engine set changed, or at a periodic check when
        the hysteresis rule says so."""
        plan = self.plan
        engine_set_changed = plan is None or plan.engine_ids != frozenset(e.id for e in engines)
        if engine_set_changed or now >= self._next_check:
            shares = normalise(self._loads)
            if (
                plan is None
                or engine_set_changed
                or self._loaded(plan.shares) != self._loaded(shares)
                or moved(plan.shares, shares, self.cfg.hysteresis)
            ):
                plan = self.plan = plan_buckets(shares, engines, plan, self.cfg)
            if now >= self._next_check:
                self._next_check = now + self.cfg.rebalance_s
        return plan

    def _loaded(self, shares: Sequence[float]) -> tuple[bool, ...]:
        return tuple(s >= self.cfg.min_share and s > 0 for s in shares)

    def _decay(self, now: float) -> None:
        if now > self._t:
            factor = 0.5 ** ((now - self._t) / self.cfg.half_life_s)
            self._loads = [x * factor for x in self._loads]
            self._t = now
