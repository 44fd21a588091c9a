"""``dsi sim validate``: the simulator against a real ``dsi serve`` on this machine (see
dsi.sim.validate).

    dsi sim validate [--requests 40] [--rate 0.5] [--bench-json FILE] [--config FILE] [--json]

Without ``--bench-json`` the cpu profile is measured first with ``dsi bench engine``'s code
(``--bench-repeats`` runs of each setting; about a minute per repeat on an idle 2-core machine),
with the torch threads the config gives each engine (``[engine] threads``; 0: torch's default).
The table (``--json``: the whole result) goes to stdout, progress and the seconds taken to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from dsi import paths
from dsi.sim.validate_slice import SliceConfig


def _validate(args: argparse.Namespace) -> int:
    from dsi.sim.validate import engine_threads, text, validate  # starts nothing until asked

    start = time.perf_counter()
    try:
        slice_cfg = SliceConfig(
            trace=args.trace,
            requests=args.requests,
            tokens_per_id=args.tokens_per_id,
            max_prompt_tokens=args.max_prompt_tokens,
            max_output_tokens=args.max_output_tokens,
            rate=args.rate,
        )
        if args.bench_json is not None:
            bench = json.loads(args.bench_json.read_text())
        else:
            import torch

            from dsi.bench.engine import run as bench_engine

            print("dsi sim validate: measuring the cpu profile (dsi bench engine)", file=sys.stderr)
            threads = engine_threads(args.config or paths.config("local.toml"))
            if threads:  # the profile of an engine as the config runs it
                torch.set_num_threads(threads)
            bench = {**bench_engine(repeats=args.bench_repeats), "threads": torch.get_num_threads()}
        print("dsi sim validate: replaying against dsi serve, then simulating", file=sys.stderr)
        result = validate(bench, slice_cfg, args.config)
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"dsi sim validate: {exc}", file=sys.stderr)
        return 2
    result["bench"] = bench
    print(json.dumps(result) if args.json else text(result))
    print(f"validated in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return 0


def register(experiments: argparse._SubParsersAction) -> None:
    """``validate`` beside ``experiment`` under ``dsi sim``."""
    p = experiments.add_parser("validate", help="replay a trace slice against dsi serve and simulate it")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--trace", type=Path, default=None, help=f"Mooncake JSONL trace (default {paths.TRACE_DEFAULT})"
    )
    p.add_argument("--requests", type=int, default=40, help="requests in the slice")
    p.add_argument("--rate", type=float, default=0.5, help="mean arrivals per second after scaling")
    p.add_argument("--tokens-per-id", type=int, default=48, help="prompt tokens per 512-token trace id")
    p.add_argument("--max-prompt-tokens", type=int, default=1536)
    p.add_argument("--max-output-tokens", type=int, default=16)
    p.add_argument(
        "--config", type=Path, default=None, help="the cluster's layout (default dsi's configs/local.toml)"
    )
    p.add_argument(
        "--bench-json", type=Path, default=None, help="the cpu profile from `dsi bench engine --json`"
    )
    p.add_argument("--bench-repeats", type=int, default=1, help="repeats when measuring the profile")
    p.set_defaults(func=_validate)
