"""Decode instances (continuous batching, stepped in closed form) and the ways to pick one.

Lifecycle of a request on an instance::

    reserve (routed at arrival: pages and a state slot held while it prefills)
      -> join (handoff done: it waits for the step in progress to end)
      -> boundary (it enters the batch; every step emits one token of every request in it)
      -> leave (its last token)

Between two boundaries where the batch changes the batch steps without an event: ``m`` steps
take ``StepTimeModel.steps_s`` seconds (KV grows by one token per request per step), so an
instance has one pending event, the next boundary at which a request leaves or joiners enter.
Events carry the step count, so boundaries are exact and never rounded from times.

Those seconds are work seconds on the instance's :class:`~dsi.sim.host.WorkClock`: with a host
to itself they are wall seconds; on a shared host (:mod:`dsi.sim.host`) ``retime`` changes the
pace and moves the next event's wall time.

Routers (``route(kv_tokens, loads) -> instance``), over serving instances with room:

    bands          the real dsi.balance.DecodeBalancer (long/short bands by KV length)
    least-loaded   dsi.balance.decode.choose with one band: the lowest score, requests or KV
    round-robin    instances in turn, skipping the full ones
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from dsi.balance import DecodeBalancer, DecodeBalancerConfig, InstanceLoad, NoInstance
from dsi.balance.decode import DecodeBands, choose, fits
from dsi.sim.host import WorkClock
from dsi.sim.step_time import StepTimeModel

DECODE_ROUTERS = ("bands", "least-loaded", "round-robin")


@dataclass(slots=True)
class DecodeInstance:
    id: str
    model: StepTimeModel
    max_requests: int
    kv_capacity: int
    reserved: int = 0  # requests routed here, still prefilling
    reserved_kv: int = 0
    pending: list[tuple[int, int, int]] = field(default_factory=list)  # (request, kv, steps) joining
    pending_kv: int = 0
    batch: int = 0
    kv: int = 0  # KV tokens of the batch at the last boundary
    t0: float = 0.0  # the last boundary, work seconds (``clock``)
    wall_t0: float = 0.0  # the same, wall seconds
    steps: int = 0  # steps done at t0
    leaving: list[tuple[int, int]] = field(default_factory=list)  # heap of (last step, request)
    version: int = 0  # bumps when the next event moves; older events are stale
    next_s: float | None = None  # when the next event is due, wall seconds
    next_work: float = 0.0  # the same, work seconds
    next_steps: int = 0  # steps from t0 to the next event
    clock: WorkClock = field(default_factory=WorkClock)
    busy_s: float = 0.0  # seconds stepping a non-empty batch
    used_s: float = 0.0  # those seconds weighted by batch / max_requests (slot occupancy)
    tokens: int = 0  # output tokens emitted by steps
    _members: dict[int, tuple[int, int]] = field(default_factory=dict)  # request -> (step, KV) at entry

    def load(self, now: float) -> InstanceLoad:
        kv = self.kv + self.batch * self._steps_until(self.clock.work(now)) if self.batch else 0
        return InstanceLoad(
            id=self.id,
            role="decode",
            running_requests=self.batch + len(self.pending) + self.reserved,
            kv_tokens=kv + self.pending_kv + self.reserved_kv,
            max_requests=self.max_requests,
            kv_capacity_tokens=self.kv_capacity,
        )

    @property
    def idle(self) -> bool:
        return not (self.batch or self.pending or self.reserved)

    def step_end(self, now: float) -> float:
        """When the step in progress at ``now`` ends (``now`` when none runs): dsi's engine takes a
        reservation between two steps, so a reserve waits for it."""
        if not self.batch:
            return now
        work = self.clock.work(now)
        m = self._steps_until(work)
        at = self.t0 + self.model.steps_s(self.batch, self.kv, m)
        if at < work:
            at = self.t0 + self.model.steps_s(self.batch, self.kv, m + 1)
        return max(now, self.clock.wall(at))

    def reserve(self, kv: int) -> None:
        self.reserved += 1
        self.reserved_kv += kv

    def release(self, kv: int) -> None:
        self.reserved -= 1
        self.reserved_kv -= kv

    def join(self, request: int, kv: int, steps: int, now: float) -> tuple[float, int] | None:
        """A reserved request arrives to decode ``steps`` (>= 1) tokens. Returns the new next event
        (time, steps from the last boundary), or None when the scheduled one stands."""
        self.release(kv)
        self.pending.append((request, kv, steps))
        self.pending_kv += kv
        if not self.batch:  # idle: the batch starts now
            return self._move(self.clock.work(now), 0) if self.next_s is None or now < self.next_s else None
        work = self.clock.work(now)
        m = self._steps_until(work)
        at = self.t0 + self.model.steps_s(self.batch, self.kv, m)
        if at < work:  # a step is in progress: the joiner waits for its end
            m += 1
            at = self.t0 + self.model.steps_s(self.batch, self.kv, m)
        return self._move(at, m) if self.next_s is None or at < self.next_work else None

    def boundary(self, now: float, steps: int) -> tuple[list[int], tuple[float, int] | None]:
        """The event at ``now``, ``steps`` after the last boundary: (requests that left, the next
        event or None)."""
        if self.batch:
            self.busy_s += now - self.wall_t0
            self.used_s += (now - self.wall_t0) * self.batch / self.max_requests
            self.tokens += self.batch * steps
        self.kv += self.batch * steps
        self.steps += steps
        self.t0, self.wall_t0, self.next_s = self.clock.work(now), now, None
        left = []
        while self.leaving and self.leaving[0][0] <= self.steps:
            _, request = heapq.heappop(self.leaving)
            left.append(request)
        self._drop(left)
        for request, kv, steps_left in self.pending:
            heapq.heappush(self.leaving, (self.steps + steps_left, request))
            self._members[request] = (self.steps, kv)
            self.batch += 1
            self.kv += kv
        self.pending, self.pending_kv = [], 0
        if not self.leaving:
            return left, None
        return left, self._move(
            self.t0 + self.model.steps_s(self.batch, self.kv, self.leaving[0][0] - self.steps),
            self.leaving[0][0] - self.steps,
        )

    @property
    def computing(self) -> bool:
        """Stepping a batch (what shares a host's cores)."""
        return self.batch > 0

    def retime(self, now: float, pace: float) -> tuple[float, int] | None:
        """Run at ``pace`` (wall seconds per work second) from ``now`` on; the next event at its
        new wall time (None when none is due or the pace is unchanged)."""
        if pace == self.clock.pace:
            return None
        self.clock.set_pace(now, pace)
        if self.next_s is None:
            return None
        return self._move(self.next_work, self.next_steps)

    def _drop(self, left: list[int]) -> None:
        for request in left:
            entered, kv = self._members.pop(request)
            self.batch -= 1
            self.kv -= kv + (self.steps - entered)  # what it brought, one token per step since

    def _steps_until(self, work: float) -> int:
        return self.model.steps_within(self.batch, self.kv, work - self.t0)

    def _move(self, work: float, steps: int) -> tuple[float, int]:
        """The next event at work time ``work``: (its wall time, steps from t0)."""
        self.version += 1
        self.next_work, self.next_steps = work, steps
        self.next_s = self.clock.wall(work)
        return self.next_s, steps


Router = Callable[[int, Sequence[InstanceLoad]], str]


def decode_router(name: str, cfg: DecodeBalancerConfig | None = None) -> Router:
    cfg = cfg or DecodeBalancerConfig()
    if name == "bands":
        balancer = DecodeBalancer(cfg)
        return lambda kv, loads: balancer.route(kv, loads).instance
    if name == "least-loaded":
        one = DecodeBands(None, (), 0.0)
        return lambda kv, loads: choose(kv, loads, one, cfg).instance
    if name == "round-robin":
        turn = iter(range(1 << 62))

        def round_robin(kv: int, loads: Sequence[InstanceLoad]) -> str:
            room = [i for i in loads if fits(i, kv)]
            if not room:
                raise NoInstance(f"no serving decode instance has room for {kv} KV tokens")
            return room[next(turn) % len(room)].id

        return round_robin
    raise ValueError(f"unknown decode router {name!r}; choose from {', '.join(DECODE_ROUTERS)}")
