"""Prefill instances and the ways a request is routed to one.

An instance serves its queue first come first served, one prompt at a time, each for
``CostModel.prefill_s`` seconds of work (wall seconds with a host to itself; on a shared host,
:mod:`dsi.sim.host`, ``retime`` stretches what is left of the running one). Batching prompts at
the same FLOP rate finishes the same work by the same time; what a batch of similar lengths
saves (less padding) is not modelled.

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
    id: str
    queue: deque[PrefillJob] = field(default_factory=deque)
    running: PrefillJob | None = None
    done_at: float = 0.0  # when the running job finishes, wall seconds
    started_at: float = 0.0  # when it started
    busy_s: float = 0.0
    pace: float = 1.0  # wall seconds per second of work
    version: int = 0  # bumps when done_at moves; an older end event is stale

    @property
    def used_s(self) -> float:
        """Seconds computing: a prefill forward uses the whole instance."""
        return self.busy_s

    def load(self, now: float) -> InstanceLoad:
        """Queued un-cached tokens (the running job's pro rata), requests held."""
        queued = sum(j.uncached for j in self.queue)
        if self.running is not None and self.running.service_s > 0:
            left = max(0.0, self.done_at - now) / self.pace / self.running.service_s
            queued += round(self.running.uncached * left)
        held = len(self.queue) + (self.running is not None)
        return InstanceLoad(id=self.id, role="prefill", queued_tokens=queued, running_requests=held)

    @property
    def idle(self) -> bool:
        return self.running is None and not self.queue

    def add(self, job: PrefillJob, now: float) -> bool:
        """Queue ``job``; True when it starts at once (the caller schedules its end)."""
        self.queue.append(job)
        return self.running is None and self.start(now)

    def start(self, now: float) -> bool:
        """Start the next queued job, if any."""
        if self.running is not None or not self.queue:
            return False
        self.running = self.queue.popleft()
        self.started_at = now
        self.done_at = now + self.running.service_s * self.pace
        self.version += 1
        return True

    def finish(self) -> PrefillJob:
        job, self.running = self.running, None
        assert job is not None
        self.busy_s += self.done_at - self.started_at
        return job

    @property
    def computing(self) -> bool:
        """Running a prompt (what shares a host's cores)."""
        return self.running is not None

    def retime(self, now: float, pace: float) -> bool:
        """Run at ``pace`` from ``now`` on: True when the running job's end moved (``done_at``)."""
        if pace == self.pace:
            return False
        old, self.pace = self.pace, pace
        if self.running is None:
            return False
        self.done_at = now + (self.done_at - now) / old * pace
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
