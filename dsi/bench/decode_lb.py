"""``dsi bench decode-lb``: the decode balancer (long/short bands) beside round-robin and
least-request-count routing. A discrete-event simulation with a step-time model: no engine runs.

    dsi bench decode-lb [--instances 4] [--long 10] [--short 200] [--seed 0] [--json]

Workload: ``--long`` requests with a context drawn log-uniformly from [``--long-min``,
``--long-max``) (8K-128K) and ``--short`` ones uniformly from [256, 4,096), in a seeded random
order, arriving uniformly over ``--arrival-s`` (5 s); every request generates a uniform
[128, 1,024) tokens, and its KV grows by one token per step.

Instances: ``--instances`` identical decode instances, each a loop of steps; a request routed to
an instance joins its batch at the next step, and every running request emits one token per
step. Step time::

    step_s = fixed_s + batch * per_request_s + kv_tokens * per_kv_token_s

The shape (``dsi.sim.step_time.StepTimeModel``, shared with ``dsi sim``) is calibrated from the
``flash`` FLOP/byte estimate at an assumed device
(``--tflops`` 400 effective, ``--tb-s`` 3.0 TB/s): per_request_s = the FLOPs of one decoded
token (``dsi.model.flops.decode_flops``) / FLOP rate + the bytes a request reads every step
(its SWA rings and the 512 latents the indexer selects per layer, ``dsi.kvcache.layout``) /
bandwidth; per_kv_token_s = the indexer's bytes and FLOPs per KV token per step (one fp8 key
and scale per global entry, scored by every layer that sees global KV). ``fixed_s`` (10 ms:
weights, launches, expert all-to-all) is assumed, not derived. On this shape one request costs
as much step time as ~230K KV tokens: sparse attention makes KV length cheap.

Policies, all on the same requests:

    bands (KV load)     dsi.balance.DecodeBalancer, default config: bands sized by KV share
    bands (step cost)   the same with request_kv_tokens = per_request_s / per_kv_token_s, so a
                        band's share is its share of step time
    round-robin         instances in turn
    least-requests      the fewest running requests (ties: id)

Figures: output tokens/s (all output tokens / time until the last request finished);
step-time spread (max / min over instances of the mean step time while busy); TPOT (a
request's decode time / its tokens) p50 and p99 for short and for long requests.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from dsi.balance import DecodeBalancer, DecodeBalancerConfig, InstanceLoad
from dsi.model.config import FLASH
from dsi.sim.step_time import StepTimeModel


@dataclass(slots=True)
class Request:
    id: int
    arrival_s: float
    context: int  # KV tokens at arrival
    output: int  # tokens to generate
    kv: int = 0
    left: int = 0
    admitted_s: float = 0.0
    finished_s: float = 0.0


@dataclass(slots=True)
class _Instance:
    id: str
    running: list[Request] = field(default_factory=list)
    pending: list[Request] = field(default_factory=list)
    busy: bool = False
    steps: int = 0
    step_time_s: float = 0.0

    def load(self, max_requests: int, kv_capacity: int) -> InstanceLoad:
        held = self.running + self.pending
        return InstanceLoad(
            id=self.id,
            role="decode",
            running_requests=len(held),
            kv_tokens=sum(r.kv for r in held),
            max_requests=max_requests,
            kv_capacity_tokens=kv_capacity,
        )


Router = Callable[[Request, list[InstanceLoad]], str]


def workload(
    long: int, short: int, long_range: tuple[int, int], arrival_s: float, seed: int
) -> list[Request]:
    rng = random.Random(seed)
    contexts = [round(long_range[0] * (long_range[1] / long_range[0]) ** rng.random()) for _ in range(long)]
    contexts += [rng.randrange(256, 4_096) for _ in range(short)]
    rng.shuffle(contexts)
    times = sorted(rng.uniform(0, arrival_s) for _ in contexts)
    return [
        Request(i, t, c, rng.randrange(128, 1_024))
        for i, (t, c) in enumerate(zip(times, contexts, strict=True))
    ]


def simulate(
    requests: list[Request],
    instances: int,
    model: StepTimeModel,
    router: Router,
    max_requests: int,
    kv_capacity: int,
) -> dict:
    """Every request to its end; the figures of the module docstring."""
    reqs = [Request(r.id, r.arrival_s, r.context, r.output, r.context, r.output) for r in requests]
    pool = [_Instance(f"d{i}") for i in range(instances)]
    by_id = {p.id: p for p in pool}
    events: list[tuple[float, int, int, str]] = [
        (r.arrival_s, 0, r.id, "") for r in reqs
    ]  # 0 arrival, 1 step end
    heapq.heapify(events)
    while events:
        now, kind, rid, name = heapq.heappop(events)
        if kind == 0:
            inst = by_id[router(reqs[rid], [p.load(max_requests, kv_capacity) for p in pool])]
            inst.pending.append(reqs[rid])
            if not inst.busy:
                _start_step(inst, now, model, events)
            continue
        inst = by_id[name]
        for r in inst.running:
            r.kv, r.left = r.kv + 1, r.left - 1
            if r.left == 0:
                r.finished_s = now
        inst.running = [r for r in inst.running if r.left > 0]
        inst.busy = False
        if inst.running or inst.pending:
            _start_step(inst, now, model, events)
    return _figures(reqs, pool, requests)


def _start_step(inst: _Instance, now: float, model: StepTimeModel, events: list) -> None:
    for r in inst.pending:
        r.admitted_s = now
    inst.running += inst.pending
    inst.pending = []
    step = model.step_s(len(inst.running), sum(r.kv for r in inst.running))
    inst.busy, inst.steps, inst.step_time_s = True, inst.steps + 1, inst.step_time_s + step
    heapq.heappush(events, (now + step, 1, -1, inst.id))


def _figures(reqs: list[Request], pool: list[_Instance], original: list[Request]) -> dict:
    start = min(r.arrival_s for r in reqs)
    end = max(r.finished_s for r in reqs)
    mean_step = [p.step_time_s / p.steps for p in pool if p.steps]
    long_ids = {r.id for r in original if r.context >= 8_192}
    tpot = {r.id: (r.finished_s - r.admitted_s) / r.output for r in reqs}

    def pct(ids: list[int], q: float) -> float | None:
        return round(float(np.percentile([tpot[i] for i in ids], q)) * 1e3, 3) if ids else None

    short = [r.id for r in reqs if r.id not in long_ids]
    long = [r.id for r in reqs if r.id in long_ids]
    return {
        "output_tokens_per_s": round(sum(r.output for r in reqs) / (end - start), 1),
        "step_spread": round(max(mean_step) / min(mean_step), 3),
        "mean_step_ms": [round(s * 1e3, 3) for s in mean_step],
        "tpot_ms_short_p50": pct(short, 50),
        "tpot_ms_short_p99": pct(short, 99),
        "tpot_ms_long_p50": pct(long, 50),
        "tpot_ms_long_p99": pct(long, 99),
        "makespan_s": round(end - start, 3),
    }


def _balancer(cfg: DecodeBalancerConfig) -> Router:
    balancer = DecodeBalancer(cfg)
    return lambda req, loads: balancer.route(req.kv, loads).instance


def _round_robin() -> Router:
    turn = iter(range(10**12))
    return lambda req, loads: loads[next(turn) % len(loads)].id


def _least_requests(req: Request, loads: list[InstanceLoad]) -> str:
    return min(loads, key=lambda i: (i.running_requests, i.id)).id


def run(
    instances: int = 4,
    long: int = 10,
    short: int = 200,
    long_range: tuple[int, int] = (8_192, 131_072),
    arrival_s: float = 5.0,
    tflops: float = 400.0,
    tb_s: float = 3.0,
    fixed_ms: float = 10.0,
    max_requests: int = 256,
    kv_capacity: int = 40_000_000,
    seed: int = 0,
) -> dict:
    if (
        instances < 1
        or long < 0
        or short < 0
        or long + short < 1
        or not 8_192 <= long_range[0] < long_range[1]
    ):
        raise ValueError("instances >= 1, some requests, and long contexts in [8192, long_max) are needed")
    model = StepTimeModel.of_shape(FLASH, tflops * 1e12, tb_s * 1e12, fixed_ms / 1e3)
    weight = round(model.per_request_s / model.per_kv_token_s)
    requests = workload(long, short, long_range, arrival_s, seed)
    routers: dict[str, Router] = {
        "bands (KV load)": _balancer(DecodeBalancerConfig()),
        "bands (step cost)": _balancer(DecodeBalancerConfig(request_kv_tokens=weight)),
        "round-robin": _round_robin(),
        "least-requests": _least_requests,
    }
    return {
        "instances": instances,
        "long": long,
        "short": short,
        "seed": seed,
        "simulated": True,
        "step_model": {
            "fixed_ms": fixed_ms,
            "per_request_us": round(model.per_request_s * 1e6, 3),
            "per_kv_token_ns": round(model.per_kv_token_s * 1e9, 4),
            "request_kv_tokens": weight,
        },
        "policies": {
            name: simulate(requests, instances, model, router, max_requests, kv_capacity)
            for name, router in routers.items()
        },
    }


def format_table(f: dict) -> str:
    head = (
        "policy",
        "tokens/s",
        "step spread",
        "mean step ms",
        "TPOT short p50/p99 ms",
        "TPOT long p50/p99 ms",
    )
    rows = [head]
    for name, p in f["policies"].items():
        rows.append(
            (
                name,
                f"{p['output_tokens_per_s']:,.0f}",
                f"{p['step_spread']:.3f}",
                " ".join(f"{s:.1f}" for s in p["mean_step_ms"]),
                f"{p['tpot_ms_short_p50']} / {p['tpot_ms_short_p99']}",
                f"{p['tpot_ms_long_p50']} / {p['tpot_ms_long_p99']}",
            )
        )
    width = [max(len(r[i]) for r in rows) for i in range(len(head))]
    m = f["step_model"]
    return "\n".join(
        [
            f"simulated: {f['long']} long + {f['short']} short requests over {f['instances']} decode instances; "
            f"step = {m['fixed_ms']:g} ms + {m['per_request_us']:g} us x batch + {m['per_kv_token_ns']:g} ns x KV tokens "
            f"(one request ~ {m['request_kv_tokens']:,} KV tokens)",
            *("  ".join(v.ljust(w) for v, w in zip(r, width, strict=True)).rstrip() for r in rows),
        ]
    )


def _main(args: argparse.Namespace) -> int:
    figures = run(
        args.instances,
        args.long,
        args.short,
        (args.long_min, args.long_max),
        args.arrival_s,
        args.tflops,
        args.tb_s,
        args.fixed_ms,
        seed=args.seed,
    )
    print(json.dumps(figures) if args.json else format_table(figures))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "decode-lb",
        help="decode balancer (long/short bands) vs round-robin vs least-requests, "
        "simulated with a step-time model of the flash shape",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--instances", type=int, default=4, help="decode instances")
    parser.add_argument("--long", type=int, default=10, help="requests with a long context")
    parser.add_argument(
        "--short", type=int, default=200, help="requests with a short context (256-4,095 tokens)"
    )
    parser.add_argument("--long-min", type=int, default=8_192, help="shortest long context, tokens")
    parser.add_argument(
        "--long-max", type=int, default=131_072, help="longest long context (exclusive), tokens"
    )
    parser.add_argument(
        "--arrival-s", type=float, default=5.0, help="requests arrive uniformly over this time"
    )
    parser.add_argument("--tflops", type=float, default=400.0, help="effective TFLOP/s of one instance")
    parser.add_argument("--tb-s", type=float, default=3.0, help="effective memory bandwidth, TB/s")
    parser.add_argument("--fixed-ms", type=float, default=10.0, help="fixed cost of every step, ms")
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(func=_main)
