"""Speculative verification: the emitted tokens are the target's own draws, so they keep its
distribution (chi-square over a small vocabulary) and do not depend on the drafts; a draft that
races with the request's variates agrees with the target as often as the two distributions allow."""

import torch

from dsi.engine.params import SamplingParams
from dsi.engine.sampler import race, sample, target_probs
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
    target = torch.randn(3, V, generator=gen) * 1.5  # rows for positions 101, 102 (and the bonus)
    q = torch.softmax(torch.randn(2, V, generator=gen) * 1.5, dim=-1)  # the draft's own distributions
    return target, q


def test_greedy_accepts_the_matching_prefix():
    logits = torch.zeros(4, V)
    logits[0, 3] = logits[1, 5] = logits[2, 7] = logits[3, 9] = 1.0
    v = verify(logits, [3, 5, 1], SamplingParams(temperature=0), 0, 10)
    assert v.accepted == 2 and [s.token for s in v.tokens] == [3, 5, 7]


def test_sampled_tokens_follow_the_target_and_do_not_depend_on_the_drafts():
    """Drafts raced from q with the request's variates, verified against p: the first token must
    follow p(row 0) and the second p(row 1) (rows do not depend on the tokens here), and every
    emitted token is the one the plain sampler takes at its position, drafted or not."""
    target, q = _case()
    params = SamplingParams(temperature=0.8)
    trials = 3000
    first = torch.zeros(V)
    second = torch.zeros(V)
    agreed = accepted = 0
    for seed in range(trials):
        drafts = [race(q[i], seed, 101 + i) for i in range(2)]
        v = verify(target.clone(), drafts, params, seed, 100)
        if seed < 100:
            n = len(v.tokens)
            plain = sample(target[:n].clone(), [params] * n, [seed] * n, [101, 102, 103][:n])
            assert [s.token for s in v.tokens] == [s.token for s in plain]
        first[v.tokens[0].token] += 1
        if len(v.tokens) > 1:
            second[v.tokens[1].token] += 1
        agreed += drafts[0] == v.tokens[0].token
        accepted += v.accepted
    p0 = torch.softmax(target[0] / 0.8, dim=-1)
    p1 = torch.softmax(target[1] / 0.8, dim=-1)
    for observed, p in ((first, p0), (second, p1)):
        stat, df = chi_square(observed, p)
        assert stat < CRITICAL[df], (stat, df)
    # the coupling's floor: the first draft is accepted with probability >= (1 - TV) / (1 + TV)
    tv = 0.5 * float((p0 - q[0]).abs().sum())
    assert agreed / trials > (1 - tv) / (1 + tv) - 0.03, (agreed / trials, tv)
    assert 0 < accepted < 2 * trials


def test_a_draft_with_the_target_distribution_is_always_accepted():
    """A draft scoring only part of the vocabulary, with the target's distribution over it (the
    target puts no mass elsewhere), draws what the target draws: it reads the same variates."""
    ids = torch.tensor([2, 3, 5, 7, 11])
    logits = torch.full((3, V), float("-inf"))
    logits[:, ids] = torch.randn(3, len(ids), generator=torch.Generator().manual_seed(1))
    params = SamplingParams(temperature=0.9)
    for seed in range(200):
        drafts = [int(ids[race(target_probs(logits[i, ids], params), seed, 51 + i, ids)]) for i in range(2)]
        assert verify(logits.clone(), drafts, params, seed, 50).accepted == 2
