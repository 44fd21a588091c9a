"""Scaler: runs the autoscaler policy (:mod:`dsi.autoscale`) over the registry's live instances.

Pure bookkeeping, no I/O: every method takes ``now`` (monotonic seconds). Each decision reads,
per scaled role, the instances the registry holds and their last heartbeat loads:

    prefill demand   un-cached prompt tokens/s: the rise of every instance's ``uncached_tokens``
                     counter since the previous decision, over the seconds between them
    decode demand    active requests: running + queued summed over the live instances, the most
                     seen at any sweep (each heartbeat interval) since the previous decision, so
                     that the gaps between one request and the next do not read as a drop
    capacity         per serving instance, from [autoscale.ROLE] capacity, times the mean share
                     of their configured capacity the serving instances report (an EP group that
                     came up with fewer healthy ranks, Load.ep_ranks / ep_configured)

and applies the decision's moves to the registry at once::

    take k            ready --> serving                       (the pool first on a burst)
    return k          serving --> draining --(idle)--> ready  (back to the pool)
    stop serving k    serving --> draining --(idle, or drain_timeout_s)--> named in `stop`
    stop ready k      ready --> draining --> named in `stop`
    start k           `wanted` grows by k

``wanted`` is how many instances of the role should exist; whoever holds a provisioner
(``dsi serve``, or the controller itself with the kubernetes one) starts instances until that many run and stops those named in ``stop``. An
instance started for a shortfall serves as soon as it is ready (:meth:`keeps`), not one interval
later. An instance counts as idle once a heartbeat sent ``settle_s`` after it left service
reports no running or queued request: the gateways refresh their instance lists about once a
second, so one may still route a request there just after the move.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dsi.autoscale import Decision, DecisionLog, RoleInputs, ScalingInputs, decide
from dsi.autoscale.config import SCALED_ROLES, ScaledRole
from dsi.config.autoscale import AutoscaleRole, AutoscaleSection
from dsi.errors import InvalidRequest
from dsi.messages.control import InstanceInfo, ScaleDecision, ScaleRole, ScaleStatus
from dsi.roles.controller.lifecycle import FINAL, InstanceState, Transition
from dsi.roles.controller.registry import InstanceRegistry

S = InstanceState
RunKey = tuple[str, float]  # (instance id, started_at): one run of an instance


@dataclass(slots=True)
class _Role:
    """What the controller remembers of one scaled role between decisions."""

    config: AutoscaleRole
    wanted: int
    manual: int | None = None
    demand: float = 0.0
    peak: float = 0.0  # decode: the most active requests seen since the last decision
    to_pool: dict[RunKey, float] = field(default_factory=dict)  # -> when it left service
    to_stop: dict[RunKey, float] = field(default_factory=dict)  # -> when it left service
    from_pool: set[RunKey] = field(default_factory=set)  # of to_stop, those that never served
    counters: dict[RunKey, int] = field(default_factory=dict)  # uncached_tokens at the last decision


class Scaler:
    """The autoscaler of one controller. `settle_s`: seconds before a heartbeat's idle counts."""

    def __init__(self, section: AutoscaleSection, registry: InstanceRegistry, *, settle_s: float) -> None:
        self.section = section
        self.policy = section.policy()
        self.log = DecisionLog()
        self.settle_s = settle_s
        self._registry = registry
        self._roles = {name: _Role(cfg, cfg.initial) for name, cfg in section.scaled().items()}
        self._last_s: float | None = None  # when the last decision was made

    def roles(self) -> tuple[ScaledRole, ...]:
        """The scaled roles."""
        return tuple(self._roles)

    # ---- the ready pool (InstanceRegistry.ready_pool) -------------------------------------------
    def keeps(self, role: str, serving: int) -> bool:
        """A ready instance stays in the pool once its role serves its target."""
        return role in self._roles and serving >= self.target(role)

    def target(self, role: str) -> int:
        """The serving count wanted: the last decision's, or min_instances (or the manual
        target) before the first."""
        state = self._roles[role]
        last = self.log.latest()
        if last is not None:
            return last.role(role).target  # type: ignore[arg-type]
        return state.manual if state.manual is not None else state.config.min_instances

    # ---- decisions ------------------------------------------------------------------------------
    def due(self, now: float) -> bool:
        return self._last_s is None or now - self._last_s >= self.section.interval_s * 0.99

    def decide(self, now: float) -> tuple[Decision, list[Transition]]:
        """Decide for every scaled role, record the decision, apply its moves."""
        infos = self._registry.instances(now)
        seen = {name: self._inputs(name, infos, now) for name in SCALED_ROLES}
        decision = decide(self.policy, ScalingInputs(now_s=now, **seen), self.log.latest())
        self.log.record(decision)
        self._last_s = now
        moves: list[Transition] = []
        for name, state in self._roles.items():
            moves += self._apply(name, state, decision, _live(infos, name), now)
        return decision, moves

    def set_manual(self, role: str, instances: int) -> None:
        """Hold `role` at `instances` serving from the next decision on; -1 hands it back."""
        state = self._roles.get(role)
        if state is None:
            scaled = ", ".join(self._roles) or "none"
            raise InvalidRequest(f"{role!r} is not scaled (scaled roles: {scaled})")
        low, high = state.config.min_instances, state.config.max_instances
        if instances == -1:
            state.manual = None
        elif not low <= instances <= high:
            raise InvalidRequest(f"{instances} is outside {role}'s bounds [{low}, {high}]")
        else:
            state.manual = instances

    # ---- between decisions ------------------------------------------------------------------
    def housekeep(self, now: float) -> list[Transition]:
        """Drained instances return to the pool; runs that ended are forgotten; decode's active
        requests are sampled."""
        listed = self._registry.instances(now)
        infos = {(i.instance_id, i.started_at): i for i in listed}
        moves: list[Transition] = []
        for name, state in self._roles.items():
            if name == "decode":
                state.peak = max(state.peak, _active(_live(listed, name)))
            for key, since in list(state.to_pool.items()):
                info = infos.get(key)
                if info is None or info.state != S.DRAINING:
                    del state.to_pool[key]
                elif self._idle(info, since, now):
                    del state.to_pool[key]
                    moves += self._registry.move(
                        info.instance_id, S.READY, now, "drained: back in the ready pool"
                    )
            for key in list(state.to_stop):
                info = infos.get(key)
                if info is None or info.state in FINAL:
                    del state.to_stop[key]
                    state.from_pool.discard(key)
        return moves

    def status(self, now: float, wall: float) -> ScaleStatus:
        """The roles and the logged decisions; `wall` is unix seconds at `now`."""
        infos = self._registry.instances(now)
        roles = [
            self._role_status(name, state, _live(infos, name), now) for name, state in self._roles.items()
        ]
        decisions = [
            _decision_entry(name, decision, wall - (now - decision.inputs.now_s))
            for decision in self.log.entries()
            for name in self._roles
        ]
        return ScaleStatus(True, self.section.interval_s, self.section.quota_threshold, roles, decisions)

    # ---- internals ---------------------------------------------------------------------------
    def _inputs(self, name: ScaledRole, infos: list[InstanceInfo], now: float) -> RoleInputs:
        state = self._roles.get(name)
        if state is None:
            return RoleInputs(serving=0, capacity=1.0, demand=0.0)
        live = _live(infos, name)
        state.demand = self._demand(name, state, live, now)
        counts = self._counts(state, live)
        return RoleInputs(
            serving=counts["serving"],
            ready=counts["ready"],
            starting=counts["starting"],
            capacity=state.config.capacity * _capacity_share(live),
            demand=state.demand,
            manual=state.manual,
        )

    def _counts(self, state: _Role, live: list[InstanceInfo]) -> dict[str, int]:
        """serving, ready, starting (registered starting, draining back to the pool, and started but
        not registered yet), draining (to be stopped) and held (all but those to be stopped)."""
        keys = [(i.instance_id, i.started_at) for i in live]
        to_pool = sum(1 for k in keys if k in state.to_pool)
        to_stop = sum(1 for k in keys if k in state.to_stop)
        held = len(live) - to_stop
        pending = max(0, state.wanted - held)
        return {
            "serving": sum(1 for i in live if i.state == S.SERVING),
            "ready": sum(
                1 for i, k in zip(live, keys, strict=True) if i.state == S.READY and k not in state.to_stop
            ),
            "starting": sum(1 for i in live if i.state == S.STARTING) + to_pool + pending,
            "draining": to_stop,
            "held": held,
            "pending": pending,
        }

    def _demand(self, name: ScaledRole, state: _Role, live: list[InstanceInfo], now: float) -> float:
        if name == "decode":
            peak, state.peak = max(state.peak, _active(live)), 0.0
            return peak
        counters = {(i.instance_id, i.started_at): i.load.uncached_tokens for i in live}
        risen = sum(
            max(0, count - state.counters[key]) for key, count in counters.items() if key in state.counters
        )
        state.counters = counters
        elapsed = now - self._last_s if self._last_s is not None else 0.0
        return risen / elapsed if elapsed > 0 else 0.0

    def _apply(
        self, name: ScaledRole, state: _Role, decision: Decision, live: list[InstanceInfo], now: float
    ) -> list[Transition]:
        got = decision.role(name)
        counts = self._counts(state, live)
        ready = sorted((i for i in live if i.state == S.READY), key=lambda i: i.instance_id)
        # The least busy serving instances leave first; ties by id, the highest first.
        serving = sorted(
            (i for i in live if i.state == S.SERVING),
            key=lambda i: (i.load.running + i.load.queued, _desc(i.instance_id)),
        )
        moves: list[Transition] = []
        for info in ready[: got.take_from_pool]:
            moves += self._registry.move(
                info.instance_id, S.SERVING, now, "autoscaler: taken from the ready pool"
            )
        leaving = serving[: got.return_to_pool + got.stop_serving]
        for info in leaving[: got.return_to_pool]:
            moves += self._registry.move(
                info.instance_id, S.DRAINING, now, "autoscaler: back to the ready pool"
            )
            state.to_pool[(info.instance_id, info.started_at)] = now
        for info in leaving[got.return_to_pool :]:
            moves += self._registry.move(info.instance_id, S.DRAINING, now, "autoscaler: scale down")
            state.to_stop[(info.instance_id, info.started_at)] = now
        for info in list(reversed(ready))[: got.stop_ready]:
            moves += self._registry.move(
                info.instance_id, S.DRAINING, now, "autoscaler: above the ready pool"
            )
            state.to_stop[(info.instance_id, info.started_at)] = now
            state.from_pool.add((info.instance_id, info.started_at))
        state.wanted = counts["held"] + counts["pending"] + got.start - got.stop_serving - got.stop_ready
        return moves

    def _idle(self, info: InstanceInfo, since: float, now: float) -> bool:
        """No request reported in a heartbeat sent settle_s or more after the instance left service."""
        beat_at = now - info.last_seen_s
        return beat_at >= since + self.settle_s and info.load.running + info.load.queued == 0

    def _stop_now(self, state: _Role, live: list[InstanceInfo], now: float) -> list[str]:
        """Instances to stop: taken from the pool (they never served), or taken out of service
        and idle, or drained for drain_timeout_s."""
        names = []
        for info in live:
            key = (info.instance_id, info.started_at)
            since = state.to_stop.get(key)
            if since is None:
                continue
            if (
                key in state.from_pool
                or self._idle(info, since, now)
                or now - since >= self.section.drain_timeout_s
            ):
                names.append(info.instance_id)
        return names

    def _role_status(self, name: str, state: _Role, live: list[InstanceInfo], now: float) -> ScaleRole:
        counts = self._counts(state, live)
        last = self.log.latest()
        cfg = state.config
        return ScaleRole(
            role=name,
            min_instances=cfg.min_instances,
            max_instances=cfg.max_instances,
            ready_pool=cfg.ready_pool,
            serving=counts["serving"],
            ready=counts["ready"],
            starting=counts["starting"],
            draining=counts["draining"],
            target=self.target(name),
            pool_target=last.role(name).pool_target if last is not None else cfg.ready_pool,  # type: ignore[arg-type]
            wanted=state.wanted,
            demand=state.demand,
            capacity=cfg.capacity,
            manual=-1 if state.manual is None else state.manual,
            stop=self._stop_now(state, live, now),
        )


def _live(infos: list[InstanceInfo], role: str) -> list[InstanceInfo]:
    return [i for i in infos if i.role == role and i.state not in FINAL]


def _active(live: list[InstanceInfo]) -> float:
    return float(sum(i.load.running + i.load.queued for i in live))


def _desc(text: str) -> tuple[int, ...]:
    return tuple(-ord(c) for c in text)


def _decision_entry(name: ScaledRole, decision: Decision, at: float) -> ScaleDecision:
    seen, got = decision.inputs.role(name), decision.role(name)
    return ScaleDecision(
        at=at,
        role=name,
        serving=seen.serving,
        ready=seen.ready,
        starting=seen.starting,
        demand=seen.demand,
        capacity=seen.capacity,
        need=got.need,
        target=got.target,
        take=got.take_from_pool,
        returned=got.return_to_pool,
        stop_serving=got.stop_serving,
        stop_ready=got.stop_ready,
        start=got.start,
        pool_target=got.pool_target,
        reasons=[str(reason) for reason in got.reasons],
    )


def _capacity_share(live: list[InstanceInfo]) -> float:
    """Mean share of its configured capacity a serving instance reports (an EP group that came up
    with fewer healthy ranks serves less); 1.0 with none serving."""
    shares = [i.load.capacity_share() for i in live if i.state == "serving"]
    return sum(shares) / len(shares) if shares else 1.0
