"""Which rank computes each sequence of a step under data-parallel attention (pure).

A sequence's slice stays whole on one rank (its attention reads its own pages and rings), so the
split is a partition of slices. Longest slice first onto the least-loaded rank (lowest rank on a
tie): every rank's tokens stay within one slice of the mean, and a decode step of one-token slices
splits exactly evenly (64 over 2 ranks: 32 + 32).

Worked example: tokens [100, 1, 1, 1, 50, 1], 2 ranks -> ranks [0, 1, 1, 1, 1, 1]
(rank 0: 100 tokens, rank 1: 50 + 4 = 54).
"""

from __future__ import annotations


def split_rows(tokens: list[int], world: int, pinned: list[bool] | None = None) -> list[int]:
    """tokens: [S] tokens of each slice; pinned: [S] slices that must run on rank 0 (they count on
    its load). Returns [S] the rank of each slice."""
    if world < 1:
        raise ValueError("world must be at least 1")
    pinned = pinned or [False] * len(tokens)
    load = [0] * world
    rank = [0] * len(tokens)
    for i, n in enumerate(tokens):
        if pinned[i]:
            load[0] += n
    free = sorted((i for i in range(len(tokens)) if not pinned[i]), key=lambda i: (-tokens[i], i))
    for i in free:
        r = min(range(world), key=lambda r: (load[r], r))
        rank[i] = r
        load[r] += tokens[i]
    return rank


def rank_tokens(tokens: list[int], ranks: list[int], world: int) -> list[int]:
    """[world] tokens each rank computes under ``ranks``."""
    load = [0] * world
    for n, r in zip(tokens, ranks, strict=True):
        load[r] += n
    return load
