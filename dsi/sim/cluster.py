"""The event loop: one request's way through the cluster, on dsi's own policy code.

    arrive      entrypoint: the request's chain keys (hashed when the workload was made) ->
                the index -> predicted hit (hit_policy.predicted_hit); decode chosen by the
                decode router (KV = prompt tokens) and reserved; prefill chosen by the prefill
                router (un-cached = prompt - predicted hit). No decode with room, or no serving
                instance: the request waits, first come first served.
                With ``reserve_at_step`` the decode takes the reservation at the end of its
                step in progress (dsi's engine reserves between two steps), and only then is
                the prefill asked (``reserved``).
                The prefill fetches what the store holds (hit_policy.fetch_limit), pulls the SWA
                state at the exact boundary if a host holds it, and takes its hit
                (hit_policy.choose_hit).
    prefilled   after its queue and CostModel.prefill_s(prompt - hit, hit), alone or in a batch
                (``prefill_batch_tokens``: the batch's prompts all end with it) (of work: on a shared
                host, ``SimConfig.shared_cores``, every computing instance runs at the pace
                dsi.sim.host gives for how many compute at once, re-timed whenever that changes)
    handoff     CostModel.handoff_s later the first token reaches the client (``path_s`` later:
                the request's way outside the instances, kept in Records.path_s); the decode
                persists the prompt's pages ``persist_delay_s`` later (global store)
    step        continuous batching to the last token; then the answer's pages are persisted and
                the SWA state at its last boundary is announced
    tick        the autoscaler (:mod:`dsi.sim.scaler`), instance counts sampled, expired pages
                dropped

With ``persist`` hit-free the store holds what a hit-free run computes, as dsi's decode
persists: a request that took a bounded-replay hit persists no pages and announces no state
(``persist`` all: every request persists). Local caches (``cache`` local or affinity) keep a
prompt's pages where it was prefilled, under the same rule.

Events are ``(time, sequence, kind, a, b)``; the sequence is unique, so ties are broken by the
order events were made and nothing else is ever compared: a run is a pure function of its
inputs.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence

import numpy as np

from dsi.balance import InstanceLoad, NoInstance, PrefillBalancerConfig
from dsi.balance.prefill import least_queued
from dsi.engine.hit_policy import choose_hit, exact_boundary, fetch_limit, predicted_hit
from dsi.model.hits import max_hit
from dsi.sim.cache import PageCaches, SimClock
from dsi.sim.config import SimConfig
from dsi.sim.cost import CostModel
from dsi.sim.decode import DecodeInstance, decode_router
from dsi.sim.fleet import Fleet
from dsi.sim.host import HostShare
from dsi.sim.prefill import PrefillInstance, PrefillJob, prefill_router
from dsi.sim.profiles import HardwareProfile
from dsi.sim.records import Records
from dsi.sim.scaler import SimScaler, slo_batch
from dsi.sim.states import RingSnapshots
from dsi.sim.workload import SimRequest

ARRIVE, PREFILLED, HANDOFF, STEP, PERSIST, TICK, RESERVED = range(7)
EXPIRE_S = 3600.0  # expired pages are dropped from the indexes this often
MAX_SAMPLES = 500


class Cluster:
    def __init__(self, cfg: SimConfig, profile: HardwareProfile, requests: Sequence[SimRequest]) -> None:
        self.cfg, self.profile, self.requests = cfg, profile, requests
        self.cost = CostModel.of(profile, cfg.decoder_replay)
        self.bs, self.keep = self.cost.block_size, self.cost.keep
        self.edges = PrefillBalancerConfig()
        self.clock = SimClock()
        ttls = {"chatbot": cfg.chatbot_ttl_s, "agent": cfg.agent_ttl_s}
        scope = "global" if cfg.cache == "global" else "local"
        self.caches = PageCaches(scope, self.clock, cfg.cache_pages, ttls)
        self.states = RingSnapshots(cfg.state_snapshots)
        self.route_prefill = prefill_router(cfg.prefill_lb, self.cost.model_flops, self.edges)
        self.route_decode = decode_router(cfg.decode_lb)
        self.host = HostShare(cfg.shared_cores, cfg.engine_threads)
        self.prefills, self.decodes = self._fleets()
        self.scaler = self._scaler()
        self.rec = Records(len(requests))
        self.unshared = np.zeros(len(requests), dtype=bool)  # took a bounded-replay hit
        self.events: list[tuple] = []
        self._seq = 0
        self.waiting: deque[int] = deque()
        self.decode_of: dict[int, DecodeInstance] = {}
        self.done = 0
        self.routed_uncached = 0  # un-cached tokens routed since the last decision
        self.active = self.active_peak = 0  # requests held by decodes or waiting
        self.series: dict[str, list] = {
            k: [] for k in ("t_s", "prefill", "decode", "store_pages", "active", "waiting")
        }
        self.end_s = 0.0
        self._next_expire = EXPIRE_S
        self._next_sample = 0.0
        self._stored = 0  # pages of the request being routed that the global store holds

    def _fleets(self) -> tuple[Fleet, Fleet]:
        p = self.profile

        def decode(name: str) -> DecodeInstance:
            return DecodeInstance(name, p.decode, p.decode_max_requests, p.decode_kv_tokens)

        s = self.cfg.scaling

        def prefill(name: str) -> PrefillInstance:
            return PrefillInstance(name, self.cfg.prefill_batch_tokens)

        if s is None:
            return Fleet.fixed("p", prefill, self.cfg.prefills), Fleet.fixed("d", decode, self.cfg.decodes)
        return Fleet.scaled("p", prefill, s.prefill), Fleet.scaled("d", decode, s.decode)

    def _scaler(self) -> SimScaler | None:
        cfg = self.cfg
        if cfg.scaling is None:
            return None
        p = self.profile
        return SimScaler(
            cfg.scaling,
            cfg.prefill_capacity or self.cost.prefill_tokens_per_s(),
            cfg.decode_capacity or slo_batch(p.decode, cfg.slo_tbt_s, p.decode_max_requests),
            p.start_s,
        )

    # ---- the loop ---------------------------------------------------------------------------------
    def run(self) -> Cluster:
        span = self.requests[-1].arrival_s / self.cfg.time_scale if self.requests else 0.0
        self.sample_s = max(self.cfg.sample_s, span / MAX_SAMPLES)
        for i, req in enumerate(self.requests):
            self._push(req.arrival_s / self.cfg.time_scale, ARRIVE, i)
        self._push(0.0, TICK)
        handlers = (
            self._arrive,
            self._prefilled,
            self._handoff,
            self._step,
            self._persist,
            self._tick,
            self._reserved,
        )
        shared = self.host.shared
        while self.events:
            now, _, kind, a, b = heapq.heappop(self.events)
            self.clock.t = now
            handlers[kind](now, a, b)
            if shared:
                self._retime(now)
        return self

    def _retime(self, now: float) -> None:
        """Every instance to the pace of the host as it computes now; moved ends re-scheduled."""
        engines = [m.engine for m in (*self.prefills.members, *self.decodes.members)]
        pace = self.host.pace(sum(e.computing for e in engines))
        for e in engines:
            if isinstance(e, PrefillInstance):
                if e.retime(now, pace):
                    self._push(e.done_at, PREFILLED, None, (e, e.version))
            else:
                assert isinstance(e, DecodeInstance)
                self._next_step(e, e.retime(now, pace))

    def _push(self, at: float, kind: int, a: object = None, b: object = None) -> None:
        self._seq += 1
        heapq.heappush(self.events, (at, self._seq, kind, a, b))

    # ---- arrival and routing -------------------------------------------------------------------
    def _arrive(self, now: float, i: int, _: object) -> None:
        self.rec.arrival_s[i] = now
        self.rec.prompt[i], self.rec.output[i] = (
            self.requests[i].prompt_tokens,
            self.requests[i].output_tokens,
        )
        if self.waiting or not self._admit(i, now):
            self.rec.waited[i] = True
            self.waiting.append(i)
        self.active_peak = max(self.active_peak, self.active + len(self.waiting))

    def _admit(self, i: int, now: float) -> bool:
        req = self.requests[i]
        prefills, decodes = self.prefills.serving(), self.decodes.serving()
        if not prefills or not decodes:
            return False
        try:
            decode_id = self.route_decode(req.prompt_tokens, [m.engine.load(now) for m in decodes])
        except NoInstance:
            return False
        loads = [m.engine.load(now) for m in prefills]
        prefill_id, self.rec.bucket[i], self.rec.predicted[i] = self._route_prefill(req, loads, now)
        decode = next(m.engine for m in decodes if m.id == decode_id)
        prefill = next(m.engine for m in prefills if m.id == prefill_id)
        assert isinstance(decode, DecodeInstance) and isinstance(prefill, PrefillInstance)
        decode.reserve(req.prompt_tokens)
        self.decode_of[i] = decode
        job = self._job(i, prefill_id)
        self.routed_uncached += job.uncached
        self.active += 1
        reserved = decode.step_end(now) if self.cfg.reserve_at_step else now
        if reserved > now:
            self._push(reserved, RESERVED, prefill, job)
        else:
            self._reserved(now, prefill, job)
        return True

    def _reserved(self, now: float, prefill: PrefillInstance, job: PrefillJob) -> None:
        """The decode holds the request's pages: the prefill is asked."""
        if prefill.add(job, now):
            self._push(prefill.done_at, PREFILLED, None, (prefill, prefill.version))

    def _route_prefill(self, req: SimRequest, loads: list[InstanceLoad], now: float) -> tuple[str, int, int]:
        """(prefill id, bucket, predicted hit tokens)."""
        usable = req.keys[: max_hit(req.prompt_tokens, self.bs) // self.bs]
        policy, prompt = self.cfg.hit_policy, req.prompt_tokens
        if self.cfg.cache == "affinity":
            stored = {e.id: self.caches.stored(e.id, usable) for e in loads}
            best = max(stored.values())
            chosen = least_queued(loads, [e.id for e in loads if stored[e.id] == best]).id
            hit = predicted_hit(policy, best * self.bs, prompt, self.keep, self.bs)
            return chosen, self.edges.bucket_of(max(1, prompt - hit)), hit
        hit = 0
        if self.cfg.cache == "global":  # a local cache is out of the entrypoint's sight
            # One lookup serves the entrypoint's CHECK replica and the prefill's fetch, made at
            # the same instant; the fetch touches what it reads.
            self._stored = self.caches.stored("", usable, touch=True)
            hit = predicted_hit(policy, self._stored * self.bs, prompt, self.keep, self.bs)
        instance, bucket = self.route_prefill(max(1, prompt - hit), hit, loads, now)
        return instance, bucket, hit

    def _job(self, i: int, prefill_id: str) -> PrefillJob:
        """The prefill's fetch and hit choice, as roles/prefill takes them."""
        req, bs, policy = self.requests[i], self.bs, self.cfg.hit_policy
        limit = fetch_limit(policy, req.prompt_tokens, self.keep, bs) // bs
        if self.cfg.cache == "global":
            stored = min(self._stored, limit) * bs
        else:
            stored = self.caches.stored(prefill_id, req.keys[:limit], touch=True) * bs
        boundary = exact_boundary(stored, req.prompt_tokens, self.keep, bs)
        held = boundary > 0 and self.states.pull(req.keys[boundary // bs - 1].tobytes())
        hit = choose_hit(policy, stored, req.prompt_tokens, self.keep, bs, state_held=held)
        uncached = req.prompt_tokens - hit.tokens
        flops = self.cost.prefill_flops(uncached, hit.tokens)
        self.unshared[i] = hit.tokens > 0 and not hit.exact and self.cfg.persist == "hit-free"
        self.rec.hit[i], self.rec.exact[i], self.rec.uncached[i] = hit.tokens, hit.exact, uncached
        self.rec.flops[i] = flops
        return PrefillJob(i, uncached, hit, self.cost.prefill_s(uncached, hit.tokens), flops)

    # ---- prefill, handoff, decode ----------------------------------------------------------------
    def _prefilled(self, now: float, _: object, at: tuple[PrefillInstance, int]) -> None:
        prefill, version = at
        if version != prefill.version:
            return  # the running batch's end moved since (a shared host's pace changed)
        jobs = prefill.finish()
        if prefill.start(now):
            self._push(prefill.done_at, PREFILLED, None, (prefill, prefill.version))
        for job in jobs:
            i, req = job.request, self.requests[job.request]
            if self.cfg.cache != "global" and not self.unshared[i]:
                self.caches.put(prefill.id, req.keys, req.traffic_class)
            self._push(now + self.cost.handoff_s(req.prompt_tokens), HANDOFF, i)
        self.prefills.settle(now)

    def _handoff(self, now: float, i: int, _: object) -> None:
        req, decode = self.requests[i], self.decode_of[i]
        self.rec.first_token_s[i] = now
        self.rec.path_s[i] = self.cfg.path_s + self.cfg.path_s_per_token * req.prompt_tokens
        self._persist_later(i, req.keys, now)
        if req.output_tokens == 1:
            decode.release(req.prompt_tokens)
            self._finish(i, now)
            return
        self._next_step(decode, decode.join(i, req.prompt_tokens, req.output_tokens - 1, now))

    def _step(self, now: float, decode: DecodeInstance, at: tuple[int, int]) -> None:
        version, steps = at
        if version != decode.version:
            return  # the instance's next boundary moved since
        left, moved = decode.boundary(now, steps)
        for i in left:
            req = self.requests[i]
            self._persist_later(i, req.persist_keys[len(req.keys) :], now)  # the answer's pages
            if not self.unshared[i] and len(req.persist_keys):
                self.states.announce(req.persist_keys[-1].tobytes(), now)
            self._finish(i, now)
        self._next_step(decode, moved)

    def _next_step(self, decode: DecodeInstance, moved: tuple[float, int] | None) -> None:
        if moved is not None:
            self._push(moved[0], STEP, decode, (decode.version, moved[1]))

    def _finish(self, i: int, now: float) -> None:
        self.rec.finish_s[i] = now
        del self.decode_of[i]
        self.done += 1
        self.active -= 1
        self.end_s = max(self.end_s, now)
        self._admit_waiting(now)
        self.decodes.settle(now)

    def _admit_waiting(self, now: float) -> None:
        while self.waiting and self._admit(self.waiting[0], now):
            self.waiting.popleft()

    # ---- persistence and ticks ---------------------------------------------------------------
    def _persist_later(self, i: int, keys: np.ndarray, now: float) -> None:
        if self.cfg.cache == "global" and not self.unshared[i] and len(keys):
            self._push(now + self.cfg.persist_delay_s, PERSIST, i, keys)

    def _persist(self, now: float, i: int, keys: np.ndarray) -> None:
        self.caches.put("", keys, self.requests[i].traffic_class)

    def _tick(self, now: float, _a: object, _b: object) -> None:
        if self.scaler is not None and self.scaler.due(now):
            self.scaler.decide(now, self.prefills, self.decodes, self.routed_uncached, self.active_peak)
            self.routed_uncached, self.active_peak = 0, self.active + len(self.waiting)
            self._admit_waiting(now)
        if now >= self._next_expire:
            self.caches.expire()
            self._next_expire += EXPIRE_S
        if now >= self._next_sample:
            self._sample(now)
            self._next_sample += self.sample_s
        if self.done < len(self.requests):
            step = self.cfg.scaling.interval_s if self.cfg.scaling is not None else self.sample_s
            self._push(now + min(step, self.sample_s), TICK)

    def _sample(self, now: float) -> None:
        s = self.series
        s["t_s"].append(round(now, 3))
        s["prefill"].append(self.prefills.census())
        s["decode"].append(self.decodes.census())
        s["store_pages"].append(self.caches.pages())
        s["active"].append(self.active)
        s["waiting"].append(len(self.waiting))
