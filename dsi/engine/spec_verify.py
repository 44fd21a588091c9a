"""Verification of a request's drafts against the target's logits (speculative decoding).

A verify slice computes positions ``s .. s + k`` with input tokens ``[y, d_1 .. d_k]`` (y: the
last token sampled, d_i: drafts); row i of its logits is the target's distribution for
position ``s + i + 1``, where draft ``d_{i+1}`` sits::

    row:     0        1        ...  k
    input:   y        d_1           d_k
    target:  t_0 ?= d_1   t_1 ?= d_2 ... t_k (bonus)

Each row gives the token the target takes at its position, exactly as the plain sampler would
take it (:func:`dsi.engine.sampler.choose`: the argmax when greedy, else the request's race over
its own variates at that position); drafts are accepted while ``d_{i+1} == t_i``, and the
tokens emitted are ``t_0 .. t_j`` (j drafts accepted, then the target's own token). So the
tokens a request emits never depend on its drafts: speculation changes how many tokens a step
yields, not which.

Sampled requests: the draft draws ``d_i`` with the same variates (same seed, same position, read
at its vocabulary's ids), from its own distribution ``q_i``: ``d_i = argmax q_i / E``, while
``t_i = argmax p_i / E`` (the exponential-race form of the Gumbel-max coupling). Every emitted
token is the target's own draw, so it is distributed exactly as p; the draft agrees with it,
and is accepted, with probability at least ``(1 - TV(p, q)) / (1 + TV(p, q))`` (Daliri et al.,
"Coupling without communication and drafter-invariant speculative decoding", 2024). The standard
rejection rule (accept with probability ``min(1, p/q)``, else draw from ``norm(max(0, p - q))``)
accepts slightly more often (``1 - TV``), but its emitted token depends on the draft, and so on
whether and how far the step drafted, which the batch decides; with it a re-run of a request
(failover, a different batch) would not reproduce the tokens.

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
from dsi.engine.sampler import Sampled, choose
from dsi.structured import TokenConstraint, apply_bitmask, bitmask_words


@dataclass(slots=True)
class Verified:
    tokens: list[Sampled]  # t_0 .. t_j: j accepted drafts, then the target's token
    accepted: int  # j


def verify(
    logits: torch.Tensor,
    drafts: list[int],
    params: SamplingParams,
    seed: int,
    start: int,
    constraint: TokenConstraint | None = None,
) -> Verified:
    """logits: [k + 1, V] rows of a verify slice starting at position ``start`` (masked in place
    when constrained); drafts: [k] ids; constraint: the request's, having accepted its output so
    far (advanced here)."""
    tokens: list[int] = []
    finish: str | None = None
    j = 0
    for i in range(len(drafts) + 1):
        token = choose(_masked(logits, i, constraint), params, seed, start + i + 1)
        tokens.append(token)
        if constraint is not None:
            if not constraint.accept(token):
                finish = "error"
                break
            if constraint.is_done():
                finish = "stop"
                break
        if i == len(drafts) or token != drafts[i]:
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
