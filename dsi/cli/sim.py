"""``dsi sim``: simulate a cluster on dsi's own policies (see dsi.sim).

    dsi sim [--trace PATH | --generator KIND] [policy, cluster and SLO options] [--json] [--plots DIR]
    dsi sim experiment NAME [--quick] [--json] [--plots DIR]      NAME: ttl, prefill-lb, decode-lb,
                                                                  autoscale, cache, replay
    dsi sim validate [--requests N] [--rate R] [--bench-json FILE] [--json]   (dsi.cli.sim_validate)

A run prints its figures (``--json``: the whole summary as one JSON object); the seconds it took
go to stderr, so that two runs with one seed print the same stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from dsi import paths
from dsi.autoscale import AutoscalerConfig, RoleBounds
from dsi.cli import sim_validate
from dsi.sim import plots
from dsi.sim.config import CACHES, DAY_S, PERSIST_RULES, SimConfig
from dsi.sim.decode import DECODE_ROUTERS
from dsi.sim.experiments import EXPERIMENTS, run_experiment
from dsi.sim.generators import KINDS, GeneratorConfig, generate
from dsi.sim.prefill import PREFILL_ROUTERS
from dsi.sim.profiles import PROFILES, get_profile
from dsi.sim.report import table
from dsi.sim.run import simulate
from dsi.sim.trace import trace_workload


def config_of(args: argparse.Namespace) -> SimConfig:
    scaling = None
    if args.autoscale:
        scaling = AutoscalerConfig(
            prefill=RoleBounds(
                min_instances=args.prefills,
                max_instances=args.max_prefills,
                max_change=2,
                ready_pool=args.ready_pool,
            ),
            decode=RoleBounds(
                min_instances=args.decodes,
                max_instances=args.max_decodes,
                max_change=2,
                ready_pool=args.ready_pool,
            ),
            interval_s=args.interval_s,
        )
    return SimConfig(
        prefill_lb=args.prefill_lb,
        decode_lb=args.decode_lb,
        cache=args.cache,
        cache_pages=args.cache_pages,
        chatbot_ttl_s=args.chatbot_ttl_days * DAY_S,
        agent_ttl_s=args.agent_ttl_days * DAY_S,
        hit_policy=args.hit_policy,
        persist=args.persist,
        decoder_replay=not args.no_decoder_replay,
        prefills=args.prefills,
        decodes=args.decodes,
        scaling=scaling,
        slo_ttft_s=args.slo_ttft_s,
        slo_tbt_s=args.slo_tbt_s,
        time_scale=args.time_scale,
        reserve_at_step=args.reserve_at_step,
        prefill_batch_tokens=args.prefill_batch_tokens,
        path_s=args.path_s,
        path_s_per_token=args.path_s_per_token,
        shared_cores=args.shared_cores,
        engine_threads=args.engine_threads,
    )


def workload_of(args: argparse.Namespace) -> list:
    if args.generator:
        gen = GeneratorConfig(kind=args.generator, rate=args.rate, hours=args.hours, seed=args.seed)
        return generate(gen, get_profile(args.profile, args.bench_json).model.block_size)
    return trace_workload(args.trace or paths.trace(), args.limit)


def _run(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    try:
        summary = simulate(workload_of(args), config_of(args), get_profile(args.profile, args.bench_json))
    except (ValueError, OSError) as exc:
        print(f"dsi sim: {exc}", file=sys.stderr)
        return 2
    result = {
        "experiment": "run",
        "letter": "run",
        "title": "dsi sim",
        "variants": [{"name": "run", "summary": summary}],
    }
    _plots(args, result)
    print(json.dumps(summary) if args.json else _text(summary))
    print(f"simulated in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return 0


def _experiment(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    result = run_experiment(args.name, args.quick, args.profile)
    _plots(args, result)
    print(
        json.dumps(result)
        if args.json
        else f"({result['letter']}) {result['title']}\n{result['workload']}\n\n{table(result)}"
    )
    print(f"simulated in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return 0


def _plots(args: argparse.Namespace, result: dict) -> None:
    if args.plots is None:
        return
    if not plots.available():
        print("dsi sim: matplotlib is not importable: no plots drawn", file=sys.stderr)
        return
    for path in plots.plot(result, args.plots):
        print(f"wrote {path}", file=sys.stderr)


def _text(s: dict) -> str:
    w, p = s["workload"], s["prefill"]
    lines = [
        f"{w['requests']:,} requests, {w['prompt_tokens']:,} prompt / {w['output_tokens']:,} output tokens "
        f"over {w['span_s']:g} s (done at {w['end_s']:g} s), profile {s['profile']}",
        f"TTFT s  p50 {s['ttft_s']['p50']}  p90 {s['ttft_s']['p90']}  p99 {s['ttft_s']['p99']}",
        f"TBT s   p50 {s['tbt_s']['p50']}  p90 {s['tbt_s']['p90']}  p99 {s['tbt_s']['p99']}",
        f"SLO (TTFT <= {s['slo']['ttft_s']:g} s, TBT <= {s['slo']['tbt_s']:g} s): {s['slo']['attainment']:.4f} "
        f"(TTFT {s['slo']['ttft_attainment']:.4f}, TBT {s['slo']['tbt_attainment']:.4f})",
        f"hit rate {s['hit_rate']:.4f} (predicted {s['predicted_hit_rate']:.4f}); "
        f"exact / bounded hits {p['exact_hits']:,} / {p['bounded_hits']:,}",
        f"prefill: {p['uncached_tokens']:,} un-cached tokens, {p['pflops']:g} PFLOP; requests by bucket {p['requests_by_bucket']}",
    ]
    for role, h in s["instances"].items():
        lines.append(
            f"{role}: {h['instance_hours']:g} instance-h held, {h['busy_hours']:g} busy, "
            f"{h['used_hours']:g} used, {h['idle_hours']:g} idle"
        )
    return "\n".join(lines)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--profile", choices=PROFILES, default="h800", help="hardware profile (dsi.sim.profiles)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--plots", type=Path, default=None, metavar="DIR", help="write PNG plots here (needs matplotlib)"
    )


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("sim", help="simulate a cluster on dsi's own policies (no engine runs)")
    _common(parser)
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--trace", type=Path, default=None, help=f"Mooncake JSONL trace (default {paths.TRACE_DEFAULT})"
    )
    source.add_argument("--generator", choices=KINDS, default=None, help="generate the workload instead")
    parser.add_argument("--limit", type=int, default=0, help="first N trace requests (0 = all)")
    parser.add_argument("--rate", type=float, default=2.0, help="generator: requests/s, or new sessions/s")
    parser.add_argument("--hours", type=float, default=1.0, help="generator: hours of arrivals")
    parser.add_argument("--seed", type=int, default=0, help="generator seed")
    parser.add_argument(
        "--bench-json", type=Path, default=None, help="cpu profile from `dsi bench engine --json`"
    )
    parser.add_argument("--prefill-lb", choices=PREFILL_ROUTERS, default="bucketed")
    parser.add_argument("--decode-lb", choices=DECODE_ROUTERS, default="bands")
    parser.add_argument("--cache", choices=CACHES, default="global")
    parser.add_argument("--cache-pages", type=int, default=0, help="pages per cache (0 = unbounded)")
    parser.add_argument("--hit-policy", choices=("bounded", "exact"), default="bounded")
    parser.add_argument("--persist", choices=PERSIST_RULES, default="hit-free")
    parser.add_argument(
        "--no-decoder-replay", action="store_true", help="consumer layers on every prompt token"
    )
    parser.add_argument("--chatbot-ttl-days", type=float, default=7.0)
    parser.add_argument("--agent-ttl-days", type=float, default=3.0)
    parser.add_argument(
        "--prefills", type=int, default=2, help="prefill instances (the minimum with --autoscale)"
    )
    parser.add_argument(
        "--decodes", type=int, default=4, help="decode instances (the minimum with --autoscale)"
    )
    parser.add_argument("--autoscale", action="store_true", help="scale both roles with dsi.autoscale")
    parser.add_argument("--max-prefills", type=int, default=8)
    parser.add_argument("--max-decodes", type=int, default=16)
    parser.add_argument("--ready-pool", type=int, default=1)
    parser.add_argument("--interval-s", type=float, default=30.0)
    parser.add_argument("--slo-ttft-s", type=float, default=2.0)
    parser.add_argument("--slo-tbt-s", type=float, default=0.05)
    parser.add_argument("--time-scale", type=float, default=1.0, help="divide arrival times by this")
    parser.add_argument(
        "--reserve-at-step",
        action="store_true",
        help="a decode reserves a request's pages between two steps (as dsi's engine does)",
    )
    parser.add_argument(
        "--prefill-batch-tokens",
        type=int,
        default=0,
        help="a prefill runs what waits in batches of up to this many tokens (0: one prompt at a time)",
    )
    parser.add_argument(
        "--path-s", type=float, default=0.0, help="TTFT each request spends outside the instances"
    )
    parser.add_argument("--path-s-per-token", type=float, default=0.0, help="the same, per prompt token")
    parser.add_argument(
        "--shared-cores",
        type=float,
        default=0.0,
        help="all instances share one host of this many cores (0: a device each)",
    )
    parser.add_argument(
        "--engine-threads", type=float, default=1.0, help="compute threads of each instance (--shared-cores)"
    )
    parser.set_defaults(func=_run)
    experiments = parser.add_subparsers(dest="sim_command")
    exp = experiments.add_parser("experiment", help="run one of the studies of docs/simulation.md")
    exp.add_argument("name", choices=tuple(EXPERIMENTS))
    exp.add_argument("--quick", action="store_true", help="small workloads (seconds, for tests)")
    _common(exp)
    exp.set_defaults(func=_experiment)
    sim_validate.register(experiments)
