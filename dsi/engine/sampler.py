"""Sampling from logits, deterministic per (seed, position).

A request with a frequency or presence penalty first has the logits of the ids in its output so
far lowered (``frequency_penalty * count + presence_penalty``, OpenAI's definition); a request
with a structured-output constraint has the ids its grammar forbids set to ``-inf``. Logprobs
are those of this processed distribution before temperature (0.0 for a request that asked for
none); the chosen id advances the constraint. Greedy is argmax. Otherwise: temperature, then top-k, top-p and min-p filters, then an
exponential race (argmax of p / E with E ~ Exp(1)), which draws exactly from p. The variate E of
id v at position ``p`` is a function of (seed, p, v) alone (:mod:`dsi.engine.noise`), so a
request gets the same tokens whatever else shares its batch, and whether or not it speculates
(:func:`choose` is also what the speculative verifier emits).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dsi.engine.noise import exponentials
from dsi.engine.params import SamplingParams
from dsi.structured import TokenConstraint, apply_bitmask, bitmask_words


@dataclass(slots=True)
class Sampled:
    token: int
    logprob: (
        float  # of the sampled token under the processed (penalised, constrained) untempered distribution
    )
    top: list[tuple[int, float]]
    finish: str | None = None  # from the constraint: "stop" = output complete, "error" = token rejected


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    seeds: list[int],
    positions: list[int],
    constraints: Sequence[TokenConstraint | None] | None = None,
    counts: Sequence[Counter[int] | None] | None = None,
) -> list[Sampled]:
    """logits: [N, V] fp32, one row per request (penalised and masked in place); ``positions``
    is where each token will go; ``constraints[i]`` is advanced by row i's token; ``counts[i]``:
    how often each id occurs in row i's output before its position (for the penalties)."""
    constraints = constraints or [None] * len(params)
    if counts is not None:
        _penalize(logits, params, counts)
    _mask(logits, constraints)
    out: list[Sampled] = []
    want_lp = any(p.logprobs or p.top_logprobs for p in params)
    logp = torch.log_softmax(logits, dim=-1) if want_lp else None
    greedy = logits.argmax(dim=-1).tolist()
    for row, (p, seed, position) in enumerate(zip(params, seeds, positions, strict=True)):
        token = greedy[row] if p.greedy else race(target_probs(logits[row], p), seed, position)
        lp, top = 0.0, []
        if logp is not None and (p.logprobs or p.top_logprobs):  # 0.0 otherwise, whatever the batch
            lp = float(logp[row, token])
            if p.top_logprobs:
                vals, ids = logp[row].topk(p.top_logprobs)
                top = list(zip(ids.tolist(), vals.tolist(), strict=True))
        out.append(Sampled(token, lp, top, _advance(constraints[row], token)))
    return out


def _penalize(
    logits: torch.Tensor, params: Sequence[SamplingParams], counts: Sequence[Counter[int] | None]
) -> None:
    for row, (p, c) in enumerate(zip(params, counts, strict=True)):
        if c and p.penalized:
            ids = torch.tensor(list(c.keys()), dtype=torch.long)
            n = torch.tensor(list(c.values()), dtype=logits.dtype)
            logits[row, ids] -= penalty(n, p.frequency_penalty, p.presence_penalty)


def penalty(counts: torch.Tensor, frequency: float, presence: float) -> torch.Tensor:
    """What each id's logit loses, from its count in the output so far (any shape; 0 where the
    count is 0). The reference (``reference_generate``) writes the same expression, so that the
    two round alike."""
    return frequency * counts + presence * (counts > 0).to(counts.dtype)


def _mask(logits: torch.Tensor, constraints: Sequence[TokenConstraint | None]) -> None:
    rows = [i for i, c in enumerate(constraints) if c is not None]
    if not rows:
        return
    bitmask = torch.empty(len(rows), bitmask_words(logits.shape[-1]), dtype=torch.int32)
    for j, row in enumerate(rows):
        constraints[row].fill_mask(bitmask[j])
    limited = [j for j in range(len(rows)) if not bool((bitmask[j] == -1).all())]  # else nothing to mask
    if limited:
        index = torch.tensor([rows[j] for j in limited])
        logits[index] = apply_bitmask(logits[index], bitmask[limited])


def _advance(constraint: TokenConstraint | None, token: int) -> str | None:
    if constraint is None:
        return None
    if not constraint.accept(token):
        return "error"
    return "stop" if constraint.is_done() else None


def choose(row: torch.Tensor, p: SamplingParams, seed: int, position: int) -> int:
    """The token a request takes at ``position`` from its processed logits row [V]: the argmax
    when greedy, else its race over :func:`target_probs` (what :func:`sample` takes)."""
    return int(row.argmax()) if p.greedy else race(target_probs(row, p), seed, position)


def target_probs(row: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """[V] logits -> [V] probabilities a sampled request draws from: temperature, then the
    top-k, top-p and min-p filters (not renormalised: the race compares ratios). The draft
    applies it to its own logits over its vocabulary [Vd] too."""
    scaled = row / p.temperature
    if p.top_k and p.top_k < scaled.shape[0]:
        kth = scaled.topk(p.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if p.top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        cum = sorted_p.cumsum(0)
        drop = (cum - sorted_p) >= p.top_p  # keep the smallest prefix reaching top_p
        probs = probs.scatter(0, order, sorted_p.masked_fill(drop, 0.0))
    if p.min_p > 0:
        probs = probs.masked_fill(probs < p.min_p * probs.max(), 0.0)
    return probs


def race(probs: torch.Tensor, seed: int, position: int, ids: torch.Tensor | None = None) -> int:
    """An exponential race over unnormalised probabilities [n]: the index of the largest p / E,
    E ~ Exp(1), which is drawn exactly from p / sum(p). ``ids`` [n]: the token id of each entry
    (None: 0 .. n - 1), whose variate at ``position`` of the request seeded ``seed`` it reads."""
    noise = exponentials([seed], [position], probs.shape[0] if ids is None else ids)[0]
    return int((probs / noise).argmax())
