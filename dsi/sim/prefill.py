"""Prefill instances and the ways a request is routed to one.

An instance serves its queue first come first served, one prompt at a time or in batches
(``batch_tokens``), each prompt for ``CostModel.prefill_s`` seconds of work (wall seconds with a
host to itself; on a shared host, :mod:`dsi.sim.host`, ``retime`` stretches what is left of the
running batch). A batch runs at the same FLOP rate: it ends when its prompts one after another
would, for all of them at once; what a batch of similar lengths saves (less padding) is not
modelled.

Routers (``route(uncached, cached, loads, now) -> (instance, bucket)``):

    bucketed      the real dsi.balance.PrefillBalancer, called as roles/balancer calls it (its
                  PrefillCost memoised by the cost model)
    least-loaded  dsi.balance.prefill.least_queued over every serving instance
    round-robin   serving instances in turn

Prefix-affinity routing needs the caches, so the cluster does it (:mod:`dsi.sim.cluster`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from dsi.balance import InstanceLoad, PrefillBalancer, PrefillBalancerConfig
from dsi.balance.prefill import least_queued
from dsi.engine.hit_policy import HitChoice
from dsi.sim.host import WorkClock

PREFILL_ROUTERS = ("bucketed", "least-loaded", "round-robin")


@dataclass(slots=True, frozen=True)
class PrefillJob:
    request: int  # index into the workload
    uncached: int  # tokens computed after the hit
    hit: HitChoice
    service_s: float
    flops: float


@dataclass(slots=True)
class PrefillInstance:
    """``batch_tokens`` 0: one prompt at a time; > 0: every queued prompt whose un-cached tokens
    fit that many (at least one prompt) runs in one batch, which ends for all of them together
    (dsi's engine puts what waits at a step's start into the step, up to its max_batch_tokens)."""

    id: str
    batch_tokens: int = 0
    queue: deque[PrefillJob] = field(default_factory=deque)
    batch: list[PrefillJob] = field(default_factory=list)  # running
    work_s: float = 0.0  # the running batch's seconds of work
    done_work: float = 0.0  # when the running batch ends, work seconds (``clock``)
    started_at: float = 0.0  # when it started, wall seconds
    busy_s: float = 0.0
    clock: WorkClock = field(default_factory=WorkClock)
    version: int = 0  # bumps when done_at moves; an older end event is stale

    @property
    def done_at(self) -> float:
        """When the running batch ends, wall seconds."""
        return self.clock.wall(self.done_work)

    @property
    def used_s(self) -> float:
        """Seconds computing: a prefill forward uses the whole instance."""
        return self.busy_s

    def load(self, now: float) -> InstanceLoad:
        """Queued un-cached tokens (the running batch's pro rata), requests held."""
        queued = sum(j.uncached for j in self.queue)
        if self.batch and self.work_s > 0:
            left = max(0.0, self.done_work - self.clock.work(now)) / self.work_s
            queued += round(sum(j.uncached for j in self.batch) * left)
        held = len(self.queue) + len(self.batch)
        return InstanceLoad(id=self.id, role="prefill", queued_tokens=queued, running_requests=held)

    @property
    def idle(self) -> bool:
        return not self.batch and not self.queue

    def add(self, job: PrefillJob, now: float) -> bool:
        """Queue ``job``; True when it starts at once (the caller schedules its end)."""
        self.queue.append(job)
        return not self.batch and self.start(now)

    def start(self, now: float) -> bool:
        """Start the next batch from the queue, if any."""
        if self.batch or not self.queue:
            return False
        self.batch = [self.queue.popleft()]
        tokens = self.batch[0].uncached
        while self.batch_tokens and self.queue and tokens + self.queue[0].uncached <= self.batch_tokens:
            tokens += self.queue[0].uncached
            self.batch.append(self.queue.popleft())
        self.work_s = sum(j.service_s for j in self.batch)
        self.started_at = now
        self.done_work = self.clock.work(now) + self.work_s
        self.version += 1
        return True

    def finish(self) -> list[PrefillJob]:
        """The jobs of the batch that ends now."""
        jobs, self.batch = self.batch, []
        assert jobs
        self.busy_s += self.done_at - self.started_at
        return jobs

    @property
    def computing(self) -> bool:
        """Running a batch (what shares a host's cores)."""
        return bool(self.batch)

    def retime(self, now: float, pace: float) -> bool:
        """Run at ``pace`` from ``now`` on: True when the running batch's end moved (``done_at``)."""
        if pace == self.clock.pace:
            return False
        self.clock.set_pace(now, pace)
        if not self.batch:
            return False
        self.version += 1
        return True


Router = Callable[[int, int, Sequence[InstanceLoad], float], tuple[str, int]]


def prefill_router(
    name: str, cost: Callable[[int, int], float], cfg: PrefillBalancerConfig | None = None
) -> Router:
    """``cost(uncached, cached)``: a prefill's FLOPs as dsi.balance.PrefillCost prices it."""
    cfg = cfg or PrefillBalancerConfig()
    if name == "bucketed":
        balancer = PrefillBalancer(cfg, cost)

        def bucketed(
            uncached: int, cached: int, loads: Sequence[InstanceLoad], now: float
        ) -> tuple[str, int]:
            decision = balancer.route(uncached, cached, loads, now)
            return decision.instance, decision.bucket

        return bucketed
    if name == "least-loaded":
        return lambda u, c, loads, now: (least_queued(loads, [e.id for e in loads]).id, cfg.bucket_of(u))
    if name == "round-robin":
        turn = iter(range(1 << 62))
        return lambda u, c, loads, now: (loads[next(turn) % len(loads)].id, cfg.bucket_of(u))
    raise ValueError(f"unknown prefill router {name!r}; choose from {', '.join(PREFILL_ROUTERS)}")
