"""Self-distillation of the DSpark draft on the target's own greedy outputs (``dsi model train-draft``).

Step 1: the engine (speculation off) continues ``prompts`` seeded prompts greedily: random ids
for the random-weight tiny model, chat questions (:mod:`dsi.model.chat_prompts`, training
subjects) for a trained chat model, whose answers stop at its end-of-sequence token.
Step 2: one forward per sequence over prompt + output gives the target's last hidden state at
every output position (batch invariance makes these the very bits the decode steps saw).
Step 3: the draft vocabulary is the ``vocab`` ids the outputs use most.
Step 4: the draft is trained unrolled over its ``K`` steps with teacher forcing: step i is fed
its own hidden state of step i - 1 and the true token, and learns the target's token (cross
entropy over the draft vocabulary); the confidence head learns, by binary cross entropy, whether
the draft's argmax equals that token.
Step 5: the confidence head alone is refitted on the held-out quarter of the prompts (see
:func:`calibrate`). Seeded throughout: the same arguments give the same draft (up to the thread
count's effect on float sums).

Inputs per example (t: an output position whose token y_{t+1} the target chose)::

    h_t [H],  y_{t+1},  targets y_{t+2} .. y_{t+1+K}
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dsi.engine.batch import StepSlice
from dsi.engine.engine import Engine, EngineConfig
from dsi.engine.params import SamplingParams
from dsi.model.config import ModelConfig
from dsi.model.draft import draft_step, init_draft
from dsi.model.hits import consumer_start
from dsi.model.llama import LlamaConfig
from dsi.model.ops import rms_norm


@dataclass(slots=True, frozen=True)
class TrainSettings:
    prompts: int = 64
    prompt_len: tuple[int, int] = (16, 64)
    tokens: int = 96  # greedy output tokens per prompt
    vocab: int = 4096
    layers: int = 2
    ffn: int = 512
    drafts: int = 5
    steps: int = 600
    batch: int = 256
    lr: float = 2e-3
    max_seconds: float = 1200.0  # stop training early past this CPU time (20 minutes), collection included
    seed: int = 0
    ignore_eos: bool = True  # False for a trained chat model: its answers end where it says so


@dataclass(slots=True)
class Corpus:
    hidden: torch.Tensor  # [N, H]
    tokens: torch.Tensor  # [N, K + 1] y_{t+1} .. y_{t+1+K}
    sequence: torch.Tensor  # [N] the prompt each example comes from


def prompts_for(n: int, lo: int, hi: int, seed: int, vocab: int = 120_000) -> list[list[int]]:
    """n seeded prompts of lo..hi random ids in [100, min(vocab, 120000))."""
    rng = random.Random(seed)
    top = min(vocab, 120_000)
    return [[rng.randrange(100, top) for _ in range(rng.randrange(lo, hi + 1))] for _ in range(n)]


def collect(
    cfg: ModelConfig | LlamaConfig,
    w: dict[str, torch.Tensor],
    s: TrainSettings,
    prompts: list[list[int]] | None = None,
) -> Corpus:
    """Steps 1 and 2: greedy outputs and the hidden states they came from. ``prompts``: the
    prompts to continue (default: ``s.prompts`` seeded random ones)."""
    prompts = prompts or prompts_for(s.prompts, *s.prompt_len, seed=s.seed, vocab=cfg.vocab_size)
    running = min(len(prompts), 64)
    pages = running * -(-(max(map(len, prompts)) + s.tokens) // cfg.block_size) + 1
    engine = Engine(
        cfg,
        w,
        EngineConfig(async_scheduling=False, max_running=running, num_slots=running, num_blocks=pages),
    )
    params = SamplingParams(max_tokens=s.tokens, temperature=0, ignore_eos=s.ignore_eos)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params)
    outputs = {o.request_id: o.output for o in engine.run_until_done() if o.finished}
    hidden, tokens, sequence = [], [], []
    runner, bs = engine.runner, cfg.block_size
    for i, p in enumerate(prompts):
        out = outputs[str(i)]
        seq = p + out
        n = len(out)  # positions len(p) - 1 .. len(seq) - 2 chose output tokens 0 .. n - 1
        if n < s.drafts + 2:
            continue  # too short an answer for one example
        slot, table = runner.slots.allocate(), runner.pool.allocate(-(-len(seq) // bs))
        rows: list[torch.Tensor] = []
        sl = StepSlice(slot, table, 0, seq[:-1], consumer_start(len(p), cfg.keep), True, num_logits=n)
        runner.forward([sl], None, rows)
        runner.slots.free(slot)
        runner.pool.free(table)
        k = s.drafts
        for t in range(n - k - 1):  # h of the position that chose out[t]; tokens out[t .. t + K]
            hidden.append(rows[0][t + 1])
            tokens.append(out[t + 1 : t + k + 2])
            sequence.append(i)
    engine.close()
    return Corpus(torch.stack(hidden), torch.tensor(tokens, dtype=torch.long), torch.tensor(sequence))


def draft_vocab(tokens: torch.Tensor, size: int) -> torch.Tensor:
    """Step 3: the ``size`` ids the training outputs use most (ties by id), padded with the
    lowest unused ids."""
    counts = Counter(tokens.reshape(-1).tolist())
    ids = [t for t, _ in sorted(counts.items(), key=lambda x: (-x[1], x[0]))][:size]
    used = set(ids)
    pad = (t for t in range(size * 2) if t not in used)
    ids += [next(pad) for _ in range(size - len(ids))]
    return torch.tensor(sorted(ids), dtype=torch.long)


def train(
    cfg: ModelConfig | LlamaConfig,
    w: dict[str, torch.Tensor],
    s: TrainSettings,
    log=print,
    prompts: list[list[int]] | None = None,
) -> tuple[dict[str, torch.Tensor], dict]:
    """Steps 1-5; returns (draft weights, a report of the data and the acceptance per draft
    position on the held-out prompts, whose outputs it never trained on)."""
    t0, c0 = time.perf_counter(), time.process_time()  # CPU time: the machine may be shared
    torch.manual_seed(s.seed)
    corpus = collect(cfg, w, s, prompts)
    log(f"collected {corpus.hidden.shape[0]} examples in {time.perf_counter() - t0:.0f} s")
    gen = torch.Generator().manual_seed(s.seed)
    # held out: every example of the last quarter of the prompts (examples of one output overlap)
    count = int(corpus.sequence.max()) + 1
    cut = count - max(1, count // 4)
    held = torch.nonzero(corpus.sequence >= cut)[:, 0]
    train_rows = torch.nonzero(corpus.sequence < cut)[:, 0]
    vocab = draft_vocab(corpus.tokens[train_rows], s.vocab)
    index = torch.full((cfg.vocab_size,), -100, dtype=torch.long)
    index[vocab] = torch.arange(len(vocab))
    targets = index[corpus.tokens[:, 1:]]  # [N, K] draft-vocab ids (-100: outside it)
    dw = init_draft(cfg.hidden, vocab, s.layers, s.ffn, s.seed)
    params = {k: v.requires_grad_(True) for k, v in dw.items() if k != "draft.vocab"}
    opt = torch.optim.Adam(params.values(), lr=s.lr)
    embed = w["embed"]
    step = 0
    for step in range(s.steps):
        if time.process_time() - c0 > s.max_seconds:
            break
        pick = train_rows[torch.randint(len(train_rows), (s.batch,), generator=gen)]
        loss = _loss(dw, embed, corpus, targets, pick, s.drafts, cfg.norm_eps)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            log(f"step {step}: loss {float(loss.detach()):.3f}")
    out = {k: v.detach() for k, v in dw.items()}
    conf = calibrate(out, embed, corpus, targets, held, s.drafts, cfg.norm_eps)
    acc = evaluate(out, embed, corpus, targets, held, s.drafts, cfg.norm_eps)
    report = {
        "examples": int(corpus.hidden.shape[0]),
        "held_out_examples": len(held),
        "steps": step + 1,
        "seconds": round(time.perf_counter() - t0, 1),
        "cpu_seconds": round(time.process_time() - c0, 1),
        "held_out_accept_pos": [round(a, 4) for a in acc],
        "held_out_confidence_pos": [round(c, 4) for c in conf],
    }
    return out, report


def _loss(dw, embed, corpus, targets, pick, k: int, eps: float) -> torch.Tensor:
    h, tok = corpus.hidden[pick], corpus.tokens[pick, 0]
    total = torch.zeros(())
    for i in range(k):
        h, logits, conf = draft_step(dw, embed, h, tok, eps)
        y = targets[pick, i]
        total = total + F.cross_entropy(logits, y, ignore_index=-100)
        hit = (logits.argmax(-1) == y).to(logits.dtype)
        total = total + F.binary_cross_entropy_with_logits(conf, hit)
        tok = corpus.tokens[pick, i + 1]  # teacher forcing: the true token feeds the next step
    return total


def calibrate(dw, embed, corpus, targets, rows, k: int, eps: float, steps: int = 150) -> list[float]:
    """Step 5: fit the confidence head alone (``conf_w``, ``conf_ab``) on the held-out prompts,
    the chain fed its own proposals as at serving time: on the training outputs the draft is
    right far more often than on new ones, and DSpark needs the probability of acceptance on
    new ones. A position's examples are those whose earlier drafts were all right, so that the
    confidence estimates the acceptance given the drafts before it accepted (DSpark multiplies
    them along a request's drafts). Returns the mean confidence per position after fitting."""
    with torch.no_grad():  # the chain's features do not change: compute them once
        h, tok = corpus.hidden[rows], corpus.tokens[rows, 0]
        alive = torch.ones(len(rows), dtype=torch.bool)
        feats, labels = [], []
        for i in range(k):
            h, logits, _ = draft_step(dw, embed, h, tok, eps)
            choice = logits.argmax(-1)
            z = rms_norm(h, dw["draft.out_norm"], eps)
            ok = choice == targets[rows, i]
            feats.append((z[alive], torch.log_softmax(logits, dim=-1).amax(-1)[alive]))
            labels.append(ok[alive].float())
            alive &= ok
            tok = dw["draft.vocab"][choice]
    w, ab = dw["draft.conf_w"].clone().requires_grad_(True), dw["draft.conf_ab"].clone().requires_grad_(True)
    opt = torch.optim.Adam([w, ab], lr=0.05)
    for _ in range(steps):
        loss = sum(
            F.binary_cross_entropy_with_logits(z @ w + ab[0] * top + ab[1], y)
            for (z, top), y in zip(feats, labels, strict=True)
            if len(y)  # a position no example reached with every earlier draft right
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    dw["draft.conf_w"], dw["draft.conf_ab"] = w.detach(), ab.detach()
    with torch.no_grad():
        return [
            float(torch.sigmoid(z @ w + ab[0] * top + ab[1]).mean()) if len(z) else 0.0 for z, top in feats
        ]


@torch.no_grad()
def evaluate(dw, embed, corpus, targets, rows, k: int, eps: float) -> list[float]:
    """Per draft position: the rate at which the argmax equals the target's token, given that
    every earlier position did (the chain fed its own proposals, as at serving time)."""
    h, tok = corpus.hidden[rows], corpus.tokens[rows, 0]
    alive = torch.ones(len(rows), dtype=torch.bool)
    rates = []
    for i in range(k):
        h, logits, _ = draft_step(dw, embed, h, tok, eps)
        choice = logits.argmax(-1)
        ok = choice == targets[rows, i]
        rates.append(float((ok & alive).sum()) / max(1, int(alive.sum())))
        alive &= ok
        tok = dw["draft.vocab"][choice]
    return rates
