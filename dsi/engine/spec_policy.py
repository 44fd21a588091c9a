"""How many drafts each request verifies in a step: fixed, or DSpark's variable length.

DSpark: every (request r, draft position i) gets the running product of the draft's
confidences ``P[r, i] = c[r, 1] * ... * c[r, i]``, the probability that drafts 1..i are all
accepted, so verifying it adds ``P[r, i]`` expected tokens. P falls along a request's drafts, so
ranking every pair by P and taking the best N gives each request a prefix of its drafts. N is
chosen to maximise expected output tokens per second::

    rate(N) = (B + sum of the N best P) / step_time(base + N)

B: the sampled requests (each emits at least one token); base: the step's tokens without
drafts; step_time: seconds per step against tokens in the step (the curve the engine measures
at start-up). A worked example: two requests with confidences [0.9, 0.8] and [0.3],
step_time(n) = 1 + 0.25 n, base 2: P = 0.9, 0.72 | 0.3; rate(0) = 2 / 1.5 = 1.33,
rate(1) = 2.9 / 1.75 = 1.66, rate(2) = 3.62 / 2.0 = 1.81, rate(3) = 3.92 / 2.25 = 1.74:
N = 2, lengths [2, 0].
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def fixed_lengths(available: Sequence[int], k: int, budget: int) -> list[int]:
    """Every request verifies min(k, its drafts); within ``budget`` extra tokens, in order."""
    out = []
    for n in available:
        take = max(0, min(k, n, budget))
        out.append(take)
        budget -= take
    return out


def dspark_lengths(
    confidences: Sequence[Sequence[float]],
    base_tokens: int,
    sampled: int,
    step_time: Callable[[int], float],
    budget: int,
) -> list[int]:
    """Drafts to verify per request (a prefix of each request's drafts).

    confidences: per request, the confidence of each of its drafts in order (in (0, 1]);
    base_tokens: the step's tokens without drafts; sampled: requests that emit a token this step;
    step_time(n): seconds for a step of n tokens; budget: most draft tokens the step may add."""
    # Step 1: running products, ranked over every (request, position).
    ranked = []
    for r, conf in enumerate(confidences):
        prod = 1.0
        for c in conf:
            prod *= c
            ranked.append((prod, r))
    ranked.sort(key=lambda x: -x[0])
    ranked = ranked[: max(0, budget)]
    # Step 2: the N that maximises expected tokens per second.
    best_n, best_rate, gain = 0, sampled / step_time(base_tokens), 0.0
    for n, (p, _r) in enumerate(ranked, start=1):
        gain += p
        rate = (sampled + gain) / step_time(base_tokens + n)
        if rate > best_rate:
            best_n, best_rate = n, rate
    # Step 3: each request's prefix is its count among the best N.
    lengths = [0] * len(confidences)
    for _p, r in ranked[:best_n]:
        lengths[r] += 1
    return lengths
