"""Whole instances for groups of work in proportion to their load, and the hysteresis test that
decides when a division is redone. Shared by the prefill buckets and the decode bands.

Worked example (4 buckets with compute shares 0.55 / 0.30 / 0.15 / 0)::

    >>> apportion([0.55, 0.30, 0.15, 0.0], 6)
    [3, 2, 1, 0]
    >>> neighbour_groups([0.55, 0.30, 0.15, 0.0], 2)
    [(0,), (1, 2)]
    >>> moved([0.55, 0.30, 0.15, 0.0], [0.52, 0.32, 0.16, 0.0], 0.05)
    False
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence


def normalise(loads: Sequence[float]) -> tuple[float, ...]:
    """Loads -> shares summing to 1 (all zero when there is no load)."""
    total = sum(loads)
    return tuple(x / total if total > 0 else 0.0 for x in loads)


def apportion(weights: Sequence[float], n: int) -> list[int]:
    """Instances per group, summing to ``n``: every group with weight > 0 first gets one, then
    each further instance goes to the group with the most weight per instance so far (ties: the
    lower index). The result minimises the largest weight per instance. Groups without weight
    get none; with no weight at all every count is 0.

    Needs ``n >=`` the number of groups with weight (merge neighbours first, see
    :func:`neighbour_groups`)."""
    loaded = [i for i, w in enumerate(weights) if w > 0]
    if n < len(loaded):
        raise ValueError(f"{n} instances cannot give one to each of {len(loaded)} loaded groups")
    counts = [0] * len(weights)
    if not loaded:
        return counts
    for i in loaded:
        counts[i] = 1
    for _ in range(n - len(loaded)):
        best = max(loaded, key=lambda i: (weights[i] / counts[i], -i))
        counts[best] += 1
    return counts


def neighbour_groups(weights: Sequence[float], n: int) -> list[tuple[int, ...]]:
    """The groups with weight > 0, cut into ``min(n, their number)`` runs of neighbours (in
    index order) so that the heaviest run is as light as possible (ties: the first such cut in
    lexicographic order of cut points). Each run is then served by the same instances."""
    loaded = [i for i, w in enumerate(weights) if w > 0]
    runs = min(n, len(loaded))
    if runs <= 0:
        return []
    best: list[tuple[int, ...]] = []
    best_max = float("inf")
    for cuts in itertools.combinations(range(1, len(loaded)), runs - 1):
        bounds = (0, *cuts, len(loaded))
        groups = [tuple(loaded[a:b]) for a, b in itertools.pairwise(bounds)]
        heaviest = max(sum(weights[i] for i in g) for g in groups)
        if heaviest < best_max - 1e-12:
            best, best_max = groups, heaviest
    return best


def moved(before: Sequence[float], now: Sequence[float], threshold: float) -> bool:
    """True when some share differs from its value ``before`` by more than ``threshold``."""
    return any(abs(a - b) > threshold for a, b in zip(before, now, strict=True))
