"""A request's variates: a pure function of (seed, position, id), the same read over any set of
ids, equal to a plain-Python reference of the hash, and distributed as Exp(1)."""

import math

import torch

from dsi.engine.noise import exponentials, keys
from dsi.engine.sampler import race

V = 129_280


def _fmix32(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


def test_variates_equal_the_plain_python_hash():
    ids = torch.tensor([0, 1, 5, 4095, V - 1, 2**32 - 1])
    rows = [(0, 0), (3, 7), (2**63 - 1, 16_383)]
    got = exponentials([s for s, _ in rows], [p for _, p in rows], ids)
    for r, (seed, position) in enumerate(rows):
        k1, k2 = keys(seed, position)
        want = [-math.log((_fmix32(_fmix32(v ^ k1) ^ k2) + 0.5) / 2**32) for v in ids.tolist()]
        assert got[r].tolist() == want


def test_a_subset_of_ids_reads_the_variates_of_the_whole_vocabulary():
    full = exponentials([42, 42], [10, 11], V)
    ids = torch.tensor([7, 300, 4096, 100_000, V - 1])
    assert torch.equal(exponentials([42, 42], [10, 11], ids), full[:, ids])
    assert torch.equal(exponentials([42], [11], V)[0], full[1])  # a row does not depend on the others
    assert not torch.equal(full[0], full[1])


def test_variates_are_exponential_and_uncorrelated_across_positions_and_seeds():
    e = exponentials([1, 1, 2], [5, 6, 5], V)
    for row in e:
        assert abs(float(row.mean()) - 1) < 0.02 and abs(float(row.var()) - 1) < 0.05
        for x in (0.1, 1.0, 3.0):  # the CDF at a few points
            assert abs(float((row <= x).double().mean()) - (1 - math.exp(-x))) < 0.01
    for a, b in ((0, 1), (0, 2)):
        assert abs(float(torch.corrcoef(torch.stack([e[a], e[b]]))[0, 1])) < 0.02


def test_the_race_draws_from_the_distribution_over_seeds_and_positions():
    probs = torch.tensor([0.5, 0.25, 0.125, 0.125, 0.0])
    counts = torch.zeros(5)
    for seed in range(800):
        for position in range(5):
            counts[race(probs, seed, position)] += 1
    freq = counts / counts.sum()
    assert counts[4] == 0 and torch.allclose(freq, probs, atol=0.02), freq
