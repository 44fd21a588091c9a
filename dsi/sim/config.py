"""What one simulation runs: policies, cluster size, cache layout, SLOs. Seconds and tokens.

prefill_lb      bucketed | least-loaded | round-robin          (dsi.sim.prefill)
decode_lb       bands | least-loaded | round-robin             (dsi.sim.decode)
cache           global: one store every prefill reads (dsi), routing prefix-blind
                local: a cache per prefill instance, routing prefix-blind
                affinity: a cache per prefill instance, each request to the instance whose
                cache holds the longest prefix of it (ties: the least queued)
hit_policy      bounded | exact                                (dsi.engine.hit_policy)
persist         hit-free: what dsi's decode persists - only what a hit-free run computes, so
                a request that took a bounded-replay hit persists no page and announces no
                SWA state; all: every request persists its pages (DeepSeek's design, where
                bounded replay is the served result)
decoder_replay  consumer layers on the last ``keep`` prompt tokens only (True) or on all
reserve_at_step the decode reserves a request's pages at the end of its step in progress, as
                dsi's engine does (True), or at once (False, the experiments of docs/simulation.md)
scaling         None: ``prefills`` and ``decodes`` serve all the time; else the autoscaler
                (dsi.autoscale) decides every ``scaling.interval_s``
prefill_batch_tokens  0: a prefill instance runs one prompt at a time; > 0: it runs what waits
                in one batch of up to this many un-cached tokens (dsi's engine: max_batch_tokens)
path_s          seconds each request's first token spends outside the instances (gateway,
                routing, the calls between roles), plus ``path_s_per_token`` per prompt token
shared_cores    0: every instance computes on a device of its own; > 0: all prefill and decode
                instances share one host of this many cores, each computing one with
                ``engine_threads`` threads (processor sharing, dsi.sim.host)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from dsi.autoscale import AutoscalerConfig
from dsi.engine.hit_policy import HIT_POLICIES
from dsi.sim.decode import DECODE_ROUTERS
from dsi.sim.prefill import PREFILL_ROUTERS

CACHES = ("global", "local", "affinity")
PERSIST_RULES = ("hit-free", "all")
DAY_S = 86_400.0


@dataclass(slots=True, frozen=True, kw_only=True)
class SimConfig:
    prefill_lb: str = "bucketed"
    decode_lb: str = "bands"
    cache: str = "global"
    cache_pages: int = 0  # pages per cache (the store, or each local cache); 0 = unbounded
    chatbot_ttl_s: float = 7 * DAY_S
    agent_ttl_s: float = 3 * DAY_S
    hit_policy: str = "bounded"
    persist: str = "hit-free"
    decoder_replay: bool = True
    state_snapshots: int = 0  # SWA ring snapshots held by all hosts together; 0 = unbounded
    prefills: int = 2  # serving prefill instances without scaling
    decodes: int = 4  # serving decode instances without scaling
    scaling: AutoscalerConfig | None = None
    prefill_capacity: float = 0.0  # un-cached tokens/s per prefill for the autoscaler; 0 = cost model
    decode_capacity: float = 0.0  # active requests per decode for the autoscaler; 0 = from the TBT SLO
    slo_ttft_s: float = 2.0
    slo_tbt_s: float = 0.05
    persist_delay_s: float = 0.5  # from the handoff (or a request's end) until its pages are in the store
    reserve_at_step: bool = False  # the decode reserves between two steps: the prefill waits for it
    time_scale: float = 1.0  # arrivals divided by this (> 1: the same requests at a higher rate)
    prefill_batch_tokens: int = 0  # 0 = one prompt at a time
    path_s: float = 0.0
    path_s_per_token: float = 0.0
    shared_cores: float = 0.0  # the cores all instances share; 0 = a device each
    engine_threads: float = 1.0  # compute threads of each instance on a shared host
    sample_s: float = 60.0  # instance counts sampled this often (at least 1/500 of the run)

    def __post_init__(self) -> None:
        problems = []
        for name, value, choices in (
            ("prefill_lb", self.prefill_lb, PREFILL_ROUTERS),
            ("decode_lb", self.decode_lb, DECODE_ROUTERS),
            ("cache", self.cache, CACHES),
            ("hit_policy", self.hit_policy, HIT_POLICIES),
            ("persist", self.persist, PERSIST_RULES),
        ):
            if value not in choices:
                problems.append(f"{name} must be one of {', '.join(choices)}, not {value!r}")
        if self.scaling is None and (self.prefills < 1 or self.decodes < 1):
            problems.append("a fixed cluster needs prefills >= 1 and decodes >= 1")
        if (
            self.scaling is not None
            and min(self.scaling.prefill.min_instances, self.scaling.decode.min_instances) < 1
        ):
            problems.append("a scaled role needs min_instances >= 1 (nothing would measure its demand)")
        if min(self.cache_pages, self.state_snapshots) < 0:
            problems.append("cache_pages and state_snapshots must be >= 0")
        if min(self.chatbot_ttl_s, self.agent_ttl_s, self.slo_ttft_s, self.slo_tbt_s, self.sample_s) <= 0:
            problems.append("TTLs, SLOs and sample_s must be > 0")
        if min(self.prefill_capacity, self.decode_capacity, self.persist_delay_s) < 0 or self.time_scale <= 0:
            problems.append("capacities and persist_delay_s must be >= 0, time_scale > 0")
        if self.shared_cores < 0 or self.engine_threads <= 0:
            problems.append("shared_cores must be >= 0 and engine_threads > 0")
        if min(self.prefill_batch_tokens, self.path_s, self.path_s_per_token) < 0:
            problems.append("prefill_batch_tokens, path_s and path_s_per_token must be >= 0")
        if problems:
            raise ValueError("sim config: " + "; ".join(problems))

    def describe(self) -> dict:
        """The config as JSON-ready values."""
        return asdict(self)
