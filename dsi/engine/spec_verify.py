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

Structured output: row i is masked by the constraint as it stands after the drafts before it
(one mask per draft position); the constraint is advanced by each accepted draft in turn, so a
rejected draft never reaches it, and then by the emitted token, whose ``finish`` says "stop" when
the output is complete ("error": the grammar refused it). A constraint complete after an
accepted draft ends the emitted tokens there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsi.engine.params import SamplingParams
from dsi.engine.sampler import Sampled, generator, race, target_probs
from dsi.structured import TokenConstraint, apply_bitmask, bitmask_words

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
    constraint: TokenConstraint | None = None,
) -> Verified:
    """logits: [k + 1, V] rows of a verify slice starting at position ``start`` (masked in place
    when constrained); drafts: [k] ids; q: [k, V] the draft's probabilities of each draft
    position (None for greedy requests, whose drafts are the draft's argmax); constraint: the
    request's, having accepted its output so far (advanced here)."""
    tokens: list[int] = []
    finish: str | None = None
    j = 0
    for i in range(len(drafts) + 1):
        row = _masked(logits, i, constraint)
        d = drafts[i] if i < len(drafts) else None
        token, accepted = _decide(
            row, d, None if q is None or d is None else q[i], params, seed, start + i + 1
        )
        tokens.append(token)
        if constraint is not None:
            if not constraint.accept(token):
                finish = "error"
                break
            if constraint.is_done():
                finish = "stop"
                break
        if not accepted:
            break
        j += 1
    out = _with_logprobs(logits, tokens, params)
    out[-1].finish = finish
    return Verified(out, min(j, len(tokens) - 1))


def _masked(logits: torch.Tensor, i: int, constraint: TokenConstraint | None) -> torch.Tensor:
    if constraint is None:
        return logits[i]
    bitmask = torch.empty(1, bitmask_words(logits.shape[-1]), dtype=torch.int32)
    constraint.fill_mask(bitmask[0])
    logits[i : i + 1] = apply_bitmask(logits[i : i + 1], bitmask)
    return logits[i]


def _decide(
    row: torch.Tensor,
    draft: int | None,
    q: torch.Tensor | None,
    params: SamplingParams,
    seed: int,
    position: int,
) -> tuple[int, bool]:
    """(token emitted at ``position`` from target row ``row``, whether the draft was accepted):
    the draft itself when accepted, else the target's choice (greedy: argmax; sampled: the
    residual draw after a rejection, or the target's own draw when there is no draft left)."""
    if params.greedy:
        token = int(row.argmax())
        return token, token == draft
    p = target_probs(row, params)
    if draft is None:
        return race(p, seed, position), False
    if q is None:
        raise ValueError("a sampled request's drafts need the draft probabilities")
    p = p / p.sum()
    u = float(torch.rand((), generator=generator(seed, position, ACCEPT_SALT)))
    if u * float(q[draft]) < float(p[draft]):
        return draft, True
    residual = (p - q).clamp(min=0)
    if float(residual.sum()) <= 0:  # p == q (up to rounding): any draw from p is right
        residual = p
    return race(residual, seed, position, RESIDUAL_SALT), False


def _with_logprobs(logits: torch.Tensor, tokens: list[int], params: SamplingParams) -> list[Sampled]:
    """Logprobs of the (masked) untempered rows, as the sampler reports them."""
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
