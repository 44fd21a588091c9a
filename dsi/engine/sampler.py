"""Sampling from logits, deterministic per (seed, position).

Greedy is argmax. Otherwise: temperature, then top-k, top-p and min-p filters, then an
exponential race (argmax of p / E with E ~ Exp(1)), which draws exactly from p. The noise for a
request at position ``p`` comes from a generator seeded with (seed, p) alone, so a request gets
the same tokens whatever else shares its batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsi.engine.params import SamplingParams

_MIX = 0x9E3779B97F4A7C15


@dataclass(slots=True)
class Sampled:
    token: int
    logprob: float  # of the sampled token under the model's (untempered) distribution
    top: list[tuple[int, float]]


def sample(logits: torch.Tensor, params: list[SamplingParams], seeds: list[int], positions: list[int]) -> list[Sampled]:
    """logits: [N, V] fp32; one row per request; ``positions`` is where each token will go."""
    out: list[Sampled] = []
    want_lp = any(p.logprobs or p.top_logprobs for p in params)
    logp = torch.log_softmax(logits, dim=-1) if want_lp else None
    greedy = logits.argmax(dim=-1).tolist()
    for row, (p, seed, position) in enumerate(zip(params, seeds, positions, strict=True)):
        token = greedy[row] if p.greedy else _draw(logits[row], p, seed, position)
        lp, top = 0.0, []
        if logp is not None:
            lp = float(logp[row, token])
            if p.top_logprobs:
                vals, ids = logp[row].topk(p.top_logprobs)
                top = list(zip(ids.tolist(), vals.tolist(), strict=True))
        out.append(Sampled(token, lp, top))
    return out


def _draw(row: torch.Tensor, p: SamplingParams, seed: int, position: int) -> int:
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
    gen = torch.Generator().manual_seed(((seed * _MIX) ^ (position + 1) * 0xBF58476D1CE4E5B9) % 2**63)
    noise = torch.empty_like(probs).exponential_(generator=gen)
    return int((probs / noise).argmax())
