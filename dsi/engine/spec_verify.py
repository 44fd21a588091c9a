"""Verification of a request's drafts against the target's logits (speculative decoding).

A verify slice computes positions ``s .. s + k`` with input tokens ``[y, d_1 .. d_k]`` (y: the
last token sampled, d_i: drafts); row i of its logits is the target's distribution for
position ``s + i + 1``, where draft ``d_{i+1}`` sits::

    row:     0        1        ...  k
    input:   y        d_1           d_k
    target:  t_0 ?= d_1   t_1 ?= d_2 ... t_k (bonus)

Greedy: ``t_i = argmax row_i``; drafts are accepted while ``d_{i+1} == t_i``; the tokens emitted
are ``t_0 .. t_j`` (j drafts accepted, then the target's own token): exactly what decoding one
token at a time would emit. Sampled: standard speculative rejection sampling (Leviathan et al.,
Chen et al.): draft ``d_i`` drawn from the draft's distribution ``q_i`` is accepted with
probability ``min(1, p(d_i) / q_i(d_i))``; the first rejection emits a draw from
``norm(max(0, p - q_i))`` and stops; when every draft is accepted the bonus is the target's own
draw at that position. Every emitted token is distributed exactly as the target's sampler would
draw it. The random numbers come from generators seeded by (request seed, position, salt), so a
request's output does not depend on its batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsi.engine.params import SamplingParams
from dsi.engine.sampler import Sampled, generator, race, target_probs

ACCEPT_SALT = 1  # the uniform of the acceptance test at a position
RESIDUAL_SALT = 2  # the draw from the residual distribution after a rejection
DRAFT_SALT = 3  # the draft's own draw (used by the proposer)


@dataclass(slots=True)
class Verified:
    tokens: list[Sampled]  # t_0 .. t_j: j accepted drafts, then the target's token
    accepted: int  # j


def verify(
    logits: torch.Tensor,
    drafts: list[int],
    q: torch.Tensor | None,
    params: SamplingParams,
    seed: int,
    start: int,
) -> Verified:
    """logits: [k + 1, V] rows of a verify slice starting at position ``start``; drafts: [k] ids;
    q: [k, V] the draft's probabilities of each draft position (None for greedy requests, whose
    drafts are the draft's argmax)."""
    k = len(drafts)
    if params.greedy:
        targets = logits.argmax(dim=-1).tolist()
        j = 0
        while j < k and drafts[j] == targets[j]:
            j += 1
        tokens = targets[: j + 1]
    else:
        tokens, j = _verify_sampled(logits, drafts, q, params, seed, start)
    return Verified(_with_logprobs(logits, tokens, params), j)


def _verify_sampled(
    logits: torch.Tensor,
    drafts: list[int],
    q: torch.Tensor | None,
    params: SamplingParams,
    seed: int,
    start: int,
) -> tuple[list[int], int]:
    if q is None:
        raise ValueError("a sampled request's drafts need the draft probabilities")
    tokens: list[int] = []
    for i, d in enumerate(drafts):
        position = start + i + 1  # where d sits
        p = target_probs(logits[i], params)
        p = p / p.sum()
        u = float(torch.rand((), generator=generator(seed, position, ACCEPT_SALT)))
        if u * float(q[i, d]) < float(p[d]):
            tokens.append(d)
            continue
        residual = (p - q[i]).clamp(min=0)
        if float(residual.sum()) <= 0:  # p == q (up to rounding): any draw from p is right
            residual = p
        tokens.append(race(residual, seed, position, RESIDUAL_SALT))
        return tokens, i
    tokens.append(race(target_probs(logits[len(drafts)], params), seed, start + len(drafts) + 1))
    return tokens, len(drafts)


def _with_logprobs(logits: torch.Tensor, tokens: list[int], params: SamplingParams) -> list[Sampled]:
    if not (params.logprobs or params.top_logprobs):
        return [Sampled(t, 0.0, []) for t in tokens]
    logp = torch.log_softmax(logits[: len(tokens)], dim=-1)
    out = []
    for i, t in enumerate(tokens):
        top: list[tuple[int, float]] = []
        if params.top_logprobs:
            vals, ids = logp[i].topk(params.top_logprobs)
            top = list(zip(ids.tolist(), vals.tolist(), strict=True))
        out.append(Sampled(t, float(logp[i, t]), top))
    return out
