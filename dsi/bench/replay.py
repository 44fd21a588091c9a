"""``dsi bench replay``: decoder-side bounded replay (keep = 140) vs running every layer on
every prompt token - counted FLOPs on the ``flash`` shape, wall time on ``tiny``."""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from dsi.engine.engine import Engine, EngineConfig
from dsi.engine.params import SamplingParams
from dsi.model.config import FLASH, TINY
from dsi.model.flops import prefill_flops
from dsi.model.weights import init_weights


def _prefill_seconds(weights, length: int, replay: bool) -> float:
    rng = random.Random(length)
    engine = Engine(TINY, weights, EngineConfig(replay=replay, max_batch_tokens=2048, async_scheduling=False))
    engine.add_request(
        "r", [rng.randrange(100, 120_000) for _ in range(length)], SamplingParams(max_tokens=1)
    )
    start = time.perf_counter()
    engine.run_until_done()
    elapsed = time.perf_counter() - start
    engine.close()
    return elapsed


def run(tiny_len: int = 4096, repeats: int = 3) -> dict:
    out: dict = {}
    for label, n in (("1k", 1024), ("8k", 8192), ("32k", 32768)):
        on, off = prefill_flops(FLASH, n, FLASH.keep), prefill_flops(FLASH, n, None)
        out[f"flop_keep_{label}"] = on.total
        out[f"flop_full_{label}"] = off.total
        out[f"flop_ratio_{label}"] = round(on.total / off.total, 4)
    weights = init_weights(TINY)
    on_t = [_prefill_seconds(weights, tiny_len, True) for _ in range(repeats)]
    off_t = [_prefill_seconds(weights, tiny_len, False) for _ in range(repeats)]
    out["tiny_prompt_tokens"] = tiny_len
    out["wall_keep_s"] = round(statistics.median(on_t), 4)
    out["wall_full_s"] = round(statistics.median(off_t), 4)
    out["wall_ratio_tiny"] = round(statistics.median(on_t) / statistics.median(off_t), 4)
    return out


def _main(args: argparse.Namespace) -> int:
    result = run(args.tiny_tokens, args.repeats)
    if args.json:
        print(json.dumps(result))
        return 0
    print("dsi bench replay: keep=140 vs every layer on every token")
    for label in ("1k", "8k", "32k"):
        print(
            f"  flash {label:>3} prompt: {result[f'flop_keep_{label}']:.3e} vs {result[f'flop_full_{label}']:.3e} "
            f"FLOPs, ratio {result[f'flop_ratio_{label}']:.3f}"
        )
    print(
        f"  tiny {result['tiny_prompt_tokens']}-token prefill: {result['wall_keep_s']:.3f} s vs "
        f"{result['wall_full_s']:.3f} s, ratio {result['wall_ratio_tiny']:.3f} (median of {args.repeats})"
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("replay", help="bounded replay: FLOPs on flash, wall time on tiny")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--tiny-tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.set_defaults(func=_main)
