"""The engine's speculative-decoding steps, between its forward and its update.

``build_speculator`` makes the Speculator of an engine (measuring the step-time curve of a
dspark one on scratch slots and pages); ``verify_step`` turns the logits rows of a step's verify
slices into the tokens they emit (and records how many drafts each accepted, for the rollback);
``propose_step`` drafts for every request that got tokens, from the hidden state of the row
whose logits chose its last token.
"""

from __future__ import annotations

import torch

from dsi.engine import invariant
from dsi.engine.batch import StepSlice
from dsi.engine.params import SamplingParams
from dsi.engine.request import Request
from dsi.engine.runner import ModelRunner
from dsi.engine.runner_dense import DenseRunner
from dsi.engine.sampler import Sampled
from dsi.engine.scheduler import Step
from dsi.engine.speculator import Speculator
from dsi.engine.step_curve import StepCurve
from dsi.engine.step_curve import measure as measure_curve
from dsi.model.config import ModelConfig
from dsi.model.llama import LlamaConfig


def build_speculator(
    cfg: ModelConfig | LlamaConfig,
    mode: str,
    num_drafts: int,
    curve: StepCurve | None,
    runner: ModelRunner | DenseRunner,
    weights: dict[str, torch.Tensor],
    draft: dict[str, torch.Tensor] | None,
    max_running: int,
    batch_invariant: bool = True,
) -> Speculator:
    """``batch_invariant``: the draft's products go through :func:`dsi.engine.invariant.mm`, as the
    runner's do, so that its drafts and confidences do not depend on the batch."""
    if cfg.family not in ("v4", "llama"):
        raise ValueError(f"speculative decoding runs on the V4 shape and the llama family, not {cfg.family}")
    if draft is None:
        raise ValueError("speculative decoding needs draft weights (dsi model train-draft)")
    mm = invariant.mm if batch_invariant else torch.matmul
    spec = Speculator(mode, num_drafts, draft, weights["embed"], cfg.norm_eps, cfg.max_context, mm)
    if mode == "dspark":
        spec.curve = curve or _measure(cfg, runner, spec, max_running)
    return spec


def _measure(
    cfg: ModelConfig | LlamaConfig, runner: ModelRunner | DenseRunner, spec: Speculator, max_running: int
) -> StepCurve:
    """The step-time curve of this engine, on scratch slots and pages given back after."""
    pool, slots, bs = runner.pool, runner.slots, cfg.block_size

    def allocate(b: int, tokens: int) -> tuple[list[int], list[list[int]]]:
        return [slots.allocate() for _ in range(b)], [pool.allocate(-(-tokens // bs)) for _ in range(b)]

    def free(ids: list[int], tables: list[list[int]]) -> None:
        for slot, table in zip(ids, tables, strict=True):
            runner.rollback(slot, 0)
            slots.free(slot)
            pool.free(table)

    def propose(b: int) -> None:
        spec.propose(
            [Request(str(i), [0], SamplingParams(temperature=0), 0, 0) for i in range(b)],
            torch.zeros(b, cfg.hidden),
            [0] * b,
            [1] * b,
        )

    curve = measure_curve(runner.forward, propose, allocate, free, max_running)
    spec.clear()
    return curve  # draft times are those of all K steps: what a step that verifies drafts pays


def verify_step(
    spec: Speculator,
    step: Step,
    chosen: list[tuple[StepSlice, Request]],
    rows: list[int],
    logits: torch.Tensor,
    single: list[int],
    sampled: list[Sampled],
) -> list[list[Sampled]]:
    """Per sampled slice, its tokens: ``sampled`` for the one-row slices (indices ``single``),
    the verified tokens for the verify slices; ``step.accepted`` gets each one's accepted drafts."""
    out: list[list[Sampled]] = [[] for _ in chosen]
    for i, s in zip(single, sampled, strict=True):
        out[i] = [s]
    index = {id(sl): j for j, sl in enumerate(step.slices)}
    for i, (sl, req) in enumerate(chosen):
        if sl.num_logits > 1:
            v = spec.verify(req, logits[rows[i] : rows[i] + sl.num_logits], sl.start)
            out[i] = v.tokens
            step.accepted[index[id(sl)]] = v.accepted
    return out


def propose_step(
    spec: Speculator,
    chosen: list[tuple[StepSlice, Request]],
    rows: list[int],
    hidden: torch.Tensor,
    out: list[list[Sampled]],
) -> None:
    """Draft for every eligible request that got tokens, fed by the hidden state [rows, H] of the
    row whose logits gave its last token (drafts of a request that finishes are simply unused)."""
    reqs, picks, last, positions = [], [], [], []
    for i, (sl, req) in enumerate(chosen):
        if not spec.eligible(req) or req.finished:
            continue
        reqs.append(req)
        picks.append(rows[i] + len(out[i]) - 1)
        last.append(out[i][-1].token)
        # where the first draft sits: after the last token emitted (appended by the update)
        positions.append(sl.end - sl.num_logits + len(out[i]) + 1)
    spec.propose(reqs, hidden[picks], last, positions)
