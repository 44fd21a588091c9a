"""How often a prefix hit (encoder-side bounded SWA replay) changes greedy output.

    python -m dsi.bench.hit_agreement [--prompts 20] [--tokens 16] [--seed 0]

For random prompts, a cold engine run persists its full pages; a second engine serves the same
prompt with the longest usable hit loaded from them. Prints, per prompt, the hit, the replay
start R, and how many greedy tokens agree with the hit-free run, then the agreement figures.
A hit with R = 0 reproduces the cold run up to fp32 rounding; with R > 0 the producer hidden
states of [R, R + window - 1) differ (see dsi.model.reference).
"""

from __future__ import annotations

import argparse
import random

import torch

from dsi.engine import CachedPrefix, Engine, EngineConfig
from dsi.engine.params import SamplingParams
from dsi.model.config import TINY
from dsi.model.reference import consumer_start, max_hit, replay_start
from dsi.model.weights import init_weights


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    cfg, w = TINY, init_weights(TINY)
    rng = random.Random(args.seed)
    lengths = [rng.randrange(129, 2001) for _ in range(args.prompts)]
    prompts = [[rng.randrange(100, 120_000) for _ in range(n)] for n in lengths]
    params = SamplingParams(max_tokens=args.tokens, temperature=0, ignore_eos=True)

    cold = Engine(cfg, w, EngineConfig(collect_full_pages=True))
    for i, p in enumerate(prompts):
        cold.add_request(str(i), p, params)
    cold_out = {o.request_id: o.output for o in cold.run_until_done() if o.finished}
    pages: dict[tuple[str, int], torch.Tensor] = {(p.request_id, p.index): p.data for p in cold.take_full_pages()}
    cold.close()

    warm = Engine(cfg, w)
    hits = []
    for i, p in enumerate(prompts):
        h = max_hit(len(p), cfg.block_size)
        hits.append(h)
        data = torch.stack([pages[str(i), b] for b in range(h // cfg.block_size)])
        warm.add_request(str(i), p, params, cached=CachedPrefix(h, data))
    warm_out = {o.request_id: o.output for o in warm.run_until_done() if o.finished}
    warm.close()

    same = first = 0
    common = []
    print(f"{'len':>5} {'hit':>5} {'R':>5}  agreeing tokens (of {args.tokens})")
    for i, p in enumerate(prompts):
        a, b = cold_out[str(i)], warm_out[str(i)]
        n = next((k for k, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))
        r = replay_start(hits[i], consumer_start(len(p), cfg.keep), cfg.window)
        print(f"{len(p):>5} {hits[i]:>5} {r:>5}  {n}")
        same += a == b
        first += a[0] == b[0]
        common.append(n)
    k = len(prompts)
    print(f"identical outputs: {same}/{k}; same first token: {first}/{k}; "
          f"mean agreeing prefix: {sum(common) / k:.1f} of {args.tokens} tokens")


if __name__ == "__main__":
    main()
