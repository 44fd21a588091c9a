"""``dsi bench engine``: decode throughput of the tiny model with asynchronous scheduling on and off
side by side (``decode_tok_s_b{1,16,64}_{async,sync}``), the cost of batch invariance at the
largest batch (``batch_invariant_cost`` = tok/s off / on, in the default scheduling mode), prefill
throughput, and how much of the time the device step waits for the CPU.

The idle fraction is measured from timestamps around each device step:
``sum(start[i+1] - end[i]) / sum(end[i] - start[i])`` over the decode steps of one run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import time

from dsi.engine.engine import Engine, EngineConfig, auto_async
from dsi.engine.params import SamplingParams
from dsi.model.config import TINY
from dsi.model.weights import init_weights


def _prompts(n: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, 120_000) for _ in range(length)] for _ in range(n)]


def _decode_run(
    weights, batch: int, steps: int, async_on: bool, invariant: bool = True
) -> tuple[float, float, float]:
    """(decode tokens/s, idle fraction, mean idle gap in µs) over ``steps`` decode steps."""
    engine = Engine(
        TINY,
        weights,
        EngineConfig(
            async_scheduling=async_on,
            batch_invariant=invariant,
            max_running=max(batch, 1),
            num_slots=max(batch, 1),
        ),
    )
    params = SamplingParams(max_tokens=steps + 4, temperature=0, ignore_eos=True)
    for i, p in enumerate(_prompts(batch, 32, seed=batch)):
        engine.add_request(str(i), p, params)
    started: set[str] = set()
    while len(started) < batch:  # every prompt prefilled: from here on all steps are decode steps
        started |= {o.request_id for o in engine.step() if o.new_tokens}
    first = len(engine.timings)
    for _ in range(steps):
        engine.step()
    timings = engine.timings[first:]
    engine.close()
    busy = sum(t.end - t.start for t in timings)
    idle = sum(max(0.0, b.start - a.end) for a, b in itertools.pairwise(timings))
    span = timings[-1].end - timings[0].start
    return batch * len(timings) / span, idle / busy, 1e6 * idle / max(1, len(timings) - 1)


def _prefill_run(weights, n: int, length: int) -> float:
    engine = Engine(TINY, weights, EngineConfig(max_batch_tokens=2048))
    for i, p in enumerate(_prompts(n, length, seed=99)):
        engine.add_request(str(i), p, SamplingParams(max_tokens=1, temperature=0))
    start = time.perf_counter()
    engine.run_until_done()
    elapsed = time.perf_counter() - start
    engine.close()
    return n * length / elapsed


def run(
    steps: int = 24, repeats: int = 3, batches: tuple[int, ...] = (1, 16, 64), invariance_pairs: int = 5
) -> dict:
    """Runs of each setting interleave (async, sync, async, ...), so that a noisy neighbour
    slows both sides of a ratio alike; figures are medians over ``repeats``. The invariance
    cost takes ``invariance_pairs`` interleaved on/off pairs (at least ``repeats``): its 10-20 %
    moves less than one neighbour's burst, so it gets more samples than the scheduling figures."""
    weights = init_weights(TINY)
    default_async = auto_async("cpu")
    out: dict = {
        "model": "tiny",
        "repeats": repeats,
        "decode_steps": steps,
        "default_scheduling": "async" if default_async else "sync",
    }
    big = max(batches)
    for b in batches:
        runs: dict[str, list] = {"async": [], "sync": []}
        for _ in range(repeats):
            runs["async"].append(_decode_run(weights, b, steps, True))
            runs["sync"].append(_decode_run(weights, b, steps, False))
        for mode, rs in runs.items():
            out[f"decode_tok_s_b{b}_{mode}"] = round(statistics.median(r[0] for r in rs), 1)
        if b == big:
            for mode, rs in runs.items():
                out[f"idle_frac_{mode}"] = round(statistics.median(r[1] for r in rs), 5)
                out[f"idle_gap_us_{mode}"] = round(statistics.median(r[2] for r in rs), 1)
    default, other = ("async", "sync") if default_async else ("sync", "async")
    out["default_at_least_as_fast"] = all(
        out[f"decode_tok_s_b{b}_{default}"] >= out[f"decode_tok_s_b{b}_{other}"] for b in batches
    )
    on, off = [], []
    for _ in range(max(repeats, invariance_pairs)):  # interleaved, like the scheduling runs
        on.append(_decode_run(weights, big, steps, default_async, True)[0])
        off.append(_decode_run(weights, big, steps, default_async, False)[0])
    out[f"decode_tok_s_b{big}_invariant"] = round(statistics.median(on), 1)
    out[f"decode_tok_s_b{big}_variant"] = round(statistics.median(off), 1)
    out["batch_invariant_cost"] = round(statistics.median(off) / statistics.median(on), 3)
    out["batch_invariant_pairs"] = len(on)
    out["batch_invariant_cost_per_pair"] = [round(b / a, 3) for a, b in zip(on, off, strict=True)]
    out["idle_batch"] = big
    out["prefill_tok_s"] = round(statistics.median(_prefill_run(weights, 4, 1024) for _ in range(repeats)), 1)
    return out


def _main(args: argparse.Namespace) -> int:
    result = run(args.steps, args.repeats, invariance_pairs=args.invariance_pairs)
    if args.json:
        print(json.dumps(result))
        return 0
    print("dsi bench engine (tiny model, CPU; medians)")
    for key, value in result.items():
        print(f"  {key:<20} {value}")
    verdict = "decodes at least as fast as" if result["default_at_least_as_fast"] else "is slower than"
    print(
        f"  the default ({result['default_scheduling']}) {verdict} the other mode at every batch; "
        f"batch invariance costs x{result['batch_invariant_cost']} (tok/s off / on)"
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("engine", help="decode tok/s async vs sync, batch-invariance cost, prefill tok/s")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--steps", type=int, default=24, help="decode steps measured per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--invariance-pairs", type=int, default=5, help="interleaved on/off runs for batch_invariant_cost"
    )
    parser.set_defaults(func=_main)
