"""``dsi bench prefill-lb``: the length-bucket prefill balancer beside least-loaded and round-robin
routing, on a public conversation trace. A discrete-event simulation: no engine runs.

    dsi bench prefill-lb [--engines 8] [--utilization 0.7] [--engine-pflops 1.0] [--limit N] [--json]

Every policy routes the same requests to the same engines in one run:

    bucketed      dsi.balance.PrefillBalancer (default config: 16K / 64K / 256K edges, plan checked
                  every 10 s, 5% hysteresis, loads halving every 60 s)
    least-loaded  the engine with the fewest queued un-cached tokens (ties: fewer requests, id)
    round-robin   engines in turn

Assumptions (all of them; the figures mean nothing outside them):

- requests: ``--trace`` (Mooncake's one-hour conversation trace, 12,031 requests). A request's
  un-cached tokens are ``input_length`` minus its prefix hit in a shared, unbounded store of the
  trace's 512-token ids: it hits the leading run of its ids that earlier requests persisted
  ``--persist-delay-s`` (1 s) after their arrival, in trace time; only an earlier prompt's full
  ids persist; at most the usable pages ``(input_length - 1) // 128`` count (the id-level form
  of ``dsi bench trace-hits``' shared store, without its 128-token children).
- cost: each prefill's FLOPs on the ``flash`` shape with its hit and bounded replay
  (``dsi.balance.PrefillCost``); service time = FLOPs / ``--engine-pflops`` (1 PFLOP/s by
  default, an assumed effective rate: about 69K un-cached tokens/s, near the ~74K input tokens/s
  per H800 node DeepSeek published for V3 prefill).
- engines: ``--engines`` identical engines, each serving its queue first come first served,
  one prefill at a time. Batching at the same FLOP rate finishes the same work by the same time;
  what bucketing gains inside a batch (similar lengths, less padding) is not modelled.
- load: arrival times are divided by one factor so the offered FLOPs are ``--utilization`` of
  the engines' capacity over the trace's span (``time_scale`` in the output; > 1 compresses).
- TTFT = prefill finish - arrival: queueing plus prefill only (no hit loading, transfer or
  decode step). The balancer sees every engine's exact queue when it routes (no heartbeat lag).
- max/mean load: the busiest engine's FLOPs over the mean engine's, over the whole run.
"""

from __future__ import annotations

import argparse
import heapq
import json
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dsi import paths
from dsi.balance import InstanceLoad, PrefillBalancer, PrefillBalancerConfig, PrefillCost
from dsi.sim.trace import BLOCK_TOKENS, TRACE_BLOCK, TraceRequest, load_trace

POLICIES = ("bucketed", "least-loaded", "round-robin")


@dataclass(slots=True, frozen=True)
class Job:
    arrival_s: float  # trace time, seconds
    uncached: int  # tokens to compute
    cached: int  # tokens of the prefix hit
    flops: float


def uncached_tokens(requests: Sequence[TraceRequest], persist_delay_s: float = 1.0) -> list[tuple[int, int]]:
    """(un-cached, cached) tokens per request under the shared-store hit model of the docstring."""
    stored: set[int] = set()
    pending: list[tuple[float, int, tuple[int, ...]]] = []
    out = []
    for order, req in enumerate(requests):
        while pending and pending[0][0] <= req.timestamp_s:
            stored.update(heapq.heappop(pending)[2])
        run = 0
        while run < len(req.hash_ids) and req.hash_ids[run] in stored:
            run += 1
        cached = min(run * TRACE_BLOCK, req.usable_pages * BLOCK_TOKENS)
        out.append((req.input_length - cached, cached))
        heapq.heappush(
            pending,
            (req.timestamp_s + persist_delay_s, order, req.hash_ids[: req.input_length // TRACE_BLOCK]),
        )
    return out


def jobs_of(requests: Sequence[TraceRequest], persist_delay_s: float, cost: PrefillCost) -> list[Job]:
    return [
        Job(r.timestamp_s, u, c, cost(u, c))
        for r, (u, c) in zip(requests, uncached_tokens(requests, persist_delay_s), strict=True)
    ]


@dataclass(slots=True)
class _Engine:
    """One engine's unfinished prefills: (finish time, un-cached tokens, service time)."""

    id: str
    jobs: deque[tuple[float, int, float]] = field(default_factory=deque)
    free_at: float = 0.0
    flops: float = 0.0

    def load(self, now: float) -> InstanceLoad:
        while self.jobs and self.jobs[0][0] <= now:
            self.jobs.popleft()
        queued = 0.0
        for finish, tokens, service in self.jobs:
            queued += tokens * min(1.0, (finish - now) / service) if service > 0 else 0.0
        return InstanceLoad(
            id=self.id, role="prefill", queued_tokens=round(queued), running_requests=len(self.jobs)
        )

    def take(self, now: float, job: Job, service_s: float) -> float:
        finish = max(now, self.free_at) + service_s
        self.jobs.append((finish, job.uncached, service_s))
        self.free_at, self.flops = finish, self.flops + job.flops
        return finish


Router = Callable[[Job, list[InstanceLoad], float], str]


class _Bucketed:
    """The bucket policy as a router, counting how often its plan changed."""

    def __init__(self, cfg: PrefillBalancerConfig, jobs: Sequence[Job]) -> None:
        priced = {(j.uncached, j.cached): j.flops for j in jobs}  # what jobs_of priced, not priced again
        self.balancer = PrefillBalancer(cfg, cost=lambda u, c: priced[u, c])
        self.plan_changes = 0

    def __call__(self, job: Job, loads: list[InstanceLoad], now: float) -> str:
        before = self.balancer.plan
        instance = self.balancer.route(job.uncached, job.cached, loads, now).instance
        self.plan_changes += self.balancer.plan is not before
        return instance


def _least_loaded(job: Job, loads: list[InstanceLoad], now: float) -> str:
    return min(loads, key=lambda e: (e.queued_tokens, e.running_requests, e.id)).id


def _round_robin() -> Router:
    turn = iter(range(10**12))
    return lambda job, loads, now: loads[next(turn) % len(loads)].id


def simulate(
    jobs: Sequence[Job],
    engines: int,
    flops_per_s: float,
    time_scale: float,
    router: Router,
    edges: Sequence[int],
) -> dict:
    """Replay ``jobs`` (arrivals divided by ``time_scale``) through ``engines`` FIFO engines."""
    pool = [_Engine(f"p{i:02d}") for i in range(engines)]
    by_id = {e.id: e for e in pool}
    ttft, buckets = [], []
    for job in jobs:
        now = job.arrival_s / time_scale
        loads = [e.load(now) for e in pool]
        chosen = by_id[router(job, loads, now)]
        ttft.append(chosen.take(now, job, job.flops / flops_per_s) - now)
        buckets.append(int(np.searchsorted(edges, job.uncached, side="right")))
    return _figures(np.asarray(ttft), np.asarray(buckets), [e.flops for e in pool], len(edges) + 1)


def _figures(ttft: np.ndarray, buckets: np.ndarray, flops: list[float], n_buckets: int) -> dict:
    def pct(x: np.ndarray, q: float) -> float | None:
        return round(float(np.percentile(x, q)), 3) if x.size else None

    return {
        "ttft_p50_s": pct(ttft, 50),
        "ttft_p99_s": pct(ttft, 99),
        "ttft_mean_s": round(float(ttft.mean()), 3),
        "ttft_p50_by_bucket_s": [pct(ttft[buckets == b], 50) for b in range(n_buckets)],
        "ttft_p99_by_bucket_s": [pct(ttft[buckets == b], 99) for b in range(n_buckets)],
        "load_max_over_mean": round(max(flops) / (sum(flops) / len(flops)), 3),
    }


def run(
    trace: Path,
    engines: int = 8,
    utilization: float = 0.7,
    engine_pflops: float = 1.0,
    persist_delay_s: float = 1.0,
    limit: int = 0,
) -> dict:
    if engines < 1 or not 0 < utilization < 1 or engine_pflops <= 0:
        raise ValueError("engines must be >= 1, utilization in (0, 1), engine_pflops > 0")
    start = time.perf_counter()
    requests = load_trace(trace, limit)
    cost = PrefillCost()
    jobs = jobs_of(requests, persist_delay_s, cost)
    span = max(requests[-1].timestamp_s - requests[0].timestamp_s, 1e-9)
    flops_per_s = engine_pflops * 1e15
    native = sum(j.flops for j in jobs) / (engines * flops_per_s * span)
    cfg = PrefillBalancerConfig()
    out: dict = {
        "requests": len(jobs),
        "engines": engines,
        "engine_pflops": engine_pflops,
        "utilization": utilization,
        "native_utilization": round(native, 4),
        "time_scale": round(utilization / native, 3),
        "prompt_tokens": sum(r.input_length for r in requests),
        "uncached_tokens": sum(j.uncached for j in jobs),
        "requests_by_bucket": np.bincount(
            [cfg.bucket_of(j.uncached) for j in jobs], minlength=cfg.buckets
        ).tolist(),
        "edges": list(cfg.edges),
        "policies": {},
    }
    bucketed = _Bucketed(cfg, jobs)
    for name, router in (
        ("bucketed", bucketed),
        ("least-loaded", _least_loaded),
        ("round-robin", _round_robin()),
    ):
        out["policies"][name] = simulate(jobs, engines, flops_per_s, utilization / native, router, cfg.edges)
    plan = bucketed.balancer.plan
    out["policies"]["bucketed"]["plan_changes"] = bucketed.plan_changes
    out["policies"]["bucketed"]["final_shares"] = [round(s, 4) for s in plan.shares] if plan else []
    out["policies"]["bucketed"]["final_engines_by_bucket"] = (
        [len(plan.engines[g]) if plan.groups[g][0] == b else 0 for b, g in enumerate(plan.group_of)]
        if plan
        else []
    )
    out["total_s"] = round(time.perf_counter() - start, 2)
    return out


def format_table(f: dict) -> str:
    head = ("policy", "TTFT p50 s", "TTFT p99 s", "p99 by bucket s", "max/mean load")
    rows = [head]
    for name, p in f["policies"].items():
        by_bucket = " / ".join("-" if v is None else f"{v:g}" for v in p["ttft_p99_by_bucket_s"])
        rows.append(
            (
                name,
                f"{p['ttft_p50_s']:g}",
                f"{p['ttft_p99_s']:g}",
                by_bucket,
                f"{p['load_max_over_mean']:.3f}",
            )
        )
    width = [max(len(r[i]) for r in rows) for i in range(len(head))]
    table = "\n".join("  ".join(v.ljust(w) for v, w in zip(r, width, strict=True)).rstrip() for r in rows)
    return "\n".join(
        [
            f"{f['requests']:,} requests, {f['uncached_tokens']:,} of {f['prompt_tokens']:,} prompt tokens un-cached; "
            f"requests per bucket {f['requests_by_bucket']} (edges {f['edges']})",
            f"{f['engines']} engines at {f['engine_pflops']:g} PFLOP/s, utilization {f['utilization']:g} "
            f"(the trace's own pace: {f['native_utilization']:g}; arrivals x{f['time_scale']:g}); simulated",
            table,
            f"time (s): {f['total_s']:.2f}",
        ]
    )


def _main(args: argparse.Namespace) -> int:
    figures = run(
        args.trace or paths.trace(),
        args.engines,
        args.utilization,
        args.engine_pflops,
        args.persist_delay_s,
        args.limit,
    )
    print(json.dumps(figures) if args.json else format_table(figures))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "prefill-lb",
        help="prefill balancer (length buckets) vs least-loaded vs round-robin "
        "on a trace, simulated with the flash FLOP model",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument(
        "--trace", type=Path, default=None, help=f"JSONL trace with hash_ids (default {paths.TRACE_DEFAULT})"
    )
    parser.add_argument("--limit", type=int, default=0, help="replay only the first N requests (0 = all)")
    parser.add_argument("--engines", type=int, default=8, help="prefill engines")
    parser.add_argument("--utilization", type=float, default=0.7, help="offered load / engine capacity")
    parser.add_argument("--engine-pflops", type=float, default=1.0, help="effective PFLOP/s of one engine")
    parser.add_argument(
        "--persist-delay-s",
        type=float,
        default=1.0,
        help="seconds (trace time) from a request's arrival until its pages are in the store",
    )
    parser.set_defaults(func=_main)
