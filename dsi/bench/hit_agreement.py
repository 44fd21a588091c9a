"""``dsi bench hit-agreement``: how often a bounded-replay prefix hit keeps the hit-free greedy output.

    dsi bench hit-agreement [--prompts 16] [--tokens 16] [--min-len 100] [--max-len 1000] [--json]

What a user sees who sends the same prompt twice on a cold store under ``hit_policy =
"bounded"``: the first request runs hit-free and its decode persists the full pages; the second
takes the longest usable hit (all full pages but the one holding the last prompt token) with
encoder-side bounded SWA replay, because the producing host keeps the SWA state of the prompt's
last block boundary, not of a boundary at or before ``consumer_start`` that an exact hit needs.
Under ``hit_policy = "exact"`` the second request takes no hit and its output is the first one's
(batch-invariant engine; ``tests/roles/test_hit_policy_cluster.py`` checks it through the
cluster). Both runs here are in-process engines on the tiny model's seeded weights; each
prompt's hit, replay start R and agreeing prefix are listed. A hit with R = 0 (a prompt of at
most ``keep + window`` tokens) recomputes every position, so its output is the hit-free one.
"""

from __future__ import annotations

import argparse
import json
import random

import torch

from dsi.engine import CachedPrefix, Engine, EngineConfig
from dsi.engine.params import SamplingParams
from dsi.model.config import TINY
from dsi.model.hits import consumer_start, max_hit, replay_start
from dsi.model.weights import init_weights


def run(prompts: int = 16, tokens: int = 16, min_len: int = 100, max_len: int = 1000, seed: int = 0) -> dict:
    cfg, w = TINY, init_weights(TINY)
    rng = random.Random(seed)
    ids = [
        [rng.randrange(100, 120_000) for _ in range(rng.randint(min_len, max_len))] for _ in range(prompts)
    ]
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)

    cold = Engine(cfg, w, EngineConfig(collect_full_pages=True))
    for i, p in enumerate(ids):
        cold.add_request(str(i), p, params)
    cold_out = {o.request_id: o.output for o in cold.run_until_done() if o.finished}
    pages = {(p.request_id, p.index): p.data for p in cold.take_full_pages()}
    cold.close()

    warm = Engine(cfg, w)
    hits = []
    for i, p in enumerate(ids):
        h = max_hit(len(p), cfg.block_size)
        hits.append(h)
        cached = (
            CachedPrefix(h, torch.stack([pages[str(i), b] for b in range(h // cfg.block_size)]))
            if h
            else None
        )
        warm.add_request(str(i), p, params, cached=cached)
    warm_out = {o.request_id: o.output for o in warm.run_until_done() if o.finished}
    warm.close()

    rows = []
    for i, p in enumerate(ids):
        a, b = cold_out[str(i)], warm_out[str(i)]
        agree = next((k for k, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))
        rows.append(
            {
                "prompt_tokens": len(p),
                "hit": hits[i],
                "replay_start": replay_start(hits[i], consumer_start(len(p), cfg.keep), cfg.window),
                "agreeing_tokens": agree,
            }
        )
    n = len(rows)
    return {
        "model": "tiny (seeded random weights)",
        "prompts": n,
        "tokens": tokens,
        "prompt_len": [min_len, max_len],
        "bounded_identical": round(sum(r["agreeing_tokens"] == tokens for r in rows) / n, 4),
        "bounded_same_first_token": round(sum(r["agreeing_tokens"] > 0 for r in rows) / n, 4),
        "bounded_mean_agreeing_prefix": round(sum(r["agreeing_tokens"] for r in rows) / n, 2),
        "bounded_hits_with_replay": sum(r["replay_start"] > 0 for r in rows),
        "exact_identical": 1.0,  # no hit is taken for a repeated prompt: the hit-free run again
        "rows": rows,
    }


def _main(args: argparse.Namespace) -> int:
    result = run(args.prompts, args.tokens, args.min_len, args.max_len, args.seed)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{'len':>5} {'hit':>5} {'R':>5}  agreeing tokens (of {result['tokens']})")
    for r in result["rows"]:
        print(f"{r['prompt_tokens']:>5} {r['hit']:>5} {r['replay_start']:>5}  {r['agreeing_tokens']}")
    print(
        f"bounded: identical {result['bounded_identical']:.2f}, same first token "
        f"{result['bounded_same_first_token']:.2f}, mean agreeing prefix {result['bounded_mean_agreeing_prefix']} "
        f"of {result['tokens']} ({result['bounded_hits_with_replay']} of {result['prompts']} hits replay)"
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "hit-agreement",
        help="greedy agreement of a repeated prompt's bounded-replay hit with the hit-free run",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--min-len", type=int, default=100)
    parser.add_argument("--max-len", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(func=_main)
