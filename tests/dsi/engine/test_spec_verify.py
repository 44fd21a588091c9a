"""Speculative verification keeps the target's distribution (chi-square over a vocabulary slice)."""

import torch

from dsi.engine.params import SamplingParams
from dsi.engine.spec_verify import verify

V = 12
# chi-square critical values at p = 0.001 by degrees of freedom
CRITICAL = {
    1: 10.83,
    2: 13.82,
    3: 16.27,
    4: 18.47,
    5: 20.52,
    6: 22.46,
    7: 24.32,
    8: 26.12,
    9: 27.88,
    10: 29.59,
    11: 31.26,
}


def chi_square(observed: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic and degrees of freedom; bins expecting fewer than 5 are merged."""
    expected = probs / probs.sum() * observed.sum()
    small = expected < 5
    obs = torch.cat([observed[~small], observed[small].sum().view(1)])
    exp = torch.cat([expected[~small], expected[small].sum().view(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    return float(((obs - exp) ** 2 / exp).sum()), int(keep.sum()) - 1


def _case():
    gen = torch.Generator().manual_seed(7)
    target = torch.randn(3, V, generator=gen) * 1.5  # rows for positions 0, 1 (and the bonus)
    q = torch.softmax(torch.randn(2, V, generator=gen) * 1.5, dim=-1)  # the draft's own distributions
    return target, q


def test_greedy_accepts_the_matching_prefix():
    logits = torch.zeros(4, V)
    logits[0, 3] = logits[1, 5] = logits[2, 7] = logits[3, 9] = 1.0
    v = verify(logits, [3, 5, 1], None, SamplingParams(temperature=0), 0, 10)
    assert v.accepted == 2 and [s.token for s in v.tokens] == [3, 5, 7]


def test_rejection_sampling_keeps_the_target_distribution():
    """Drafts drawn from q, verified against p: the first token must follow p(row 0) and the
    second, given the first, p(row 1) (rows do not depend on the tokens here)."""
    target, q = _case()
    params = SamplingParams(temperature=0.8)
    trials = 6000
    first = torch.zeros(V)
    second = torch.zeros(V)
    accepted = 0
    for seed in range(trials):
        gen = torch.Generator().manual_seed(10_000 + seed)
        drafts = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(2)]
        v = verify(target, drafts, q, params, seed, 100)
        first[v.tokens[0].token] += 1
        if len(v.tokens) > 1:
            second[v.tokens[1].token] += 1
        accepted += v.accepted
    p0 = torch.softmax(target[0] / 0.8, dim=-1)
    p1 = torch.softmax(target[1] / 0.8, dim=-1)
    for observed, p in ((first, p0), (second, p1)):
        stat, df = chi_square(observed, p)
        assert stat < CRITICAL[df], (stat, df)
    assert 0 < accepted < 2 * trials  # both outcomes happen: the test exercises the residual draw
