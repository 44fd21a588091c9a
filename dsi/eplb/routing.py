"""Routing among replicas: each token-expert pair goes to one replica of its expert, by load.

Experts with a single replica are placed first (they leave no choice); then each replicated
expert, heaviest first, water-fills its pairs onto its replicas' ranks: the least loaded rank
gets pairs until it reaches the next one, and so on. A rank holding two replicas of one expert
counts once. Pure and deterministic: every rank computes the same answer from the same counts.
"""

from __future__ import annotations

import torch

from dsi.eplb.placement import Placement


def pick_slots(experts: torch.Tensor, placement: Placement, layer: int) -> torch.Tensor:
    """experts: [P] int64 logical expert of each token-expert pair -> [P] int64 slot of each.

    The pairs of one expert keep their order; consecutive runs of them go to one replica each."""
    counts = torch.bincount(experts, minlength=placement.num_experts).tolist()
    replicas = placement.replicas(layer)
    per_rank = placement.slots_per_rank
    load = [0] * placement.num_ranks
    split: list[list[tuple[int, int]]] = [[] for _ in counts]  # expert -> [(slot, pairs)]
    single = [e for e in range(len(counts)) if len({s // per_rank for s in replicas[e]}) == 1]
    multi = sorted(set(range(len(counts))) - set(single), key=lambda e: (-counts[e], e))
    for e in single + multi:
        by_rank: dict[int, int] = {}
        for s in replicas[e]:
            by_rank.setdefault(s // per_rank, s)  # the first slot of each rank
        ranks = sorted(by_rank)
        shares = water_fill([load[r] for r in ranks], counts[e])
        for r, n in zip(ranks, shares, strict=True):
            load[r] += n
            if n:
                split[e].append((by_rank[r], n))
    order = experts.argsort(stable=True)
    slots = torch.empty_like(experts)
    a = 0
    for e in range(len(counts)):
        for s, n in split[e]:
            slots[order[a : a + n]] = s
            a += n
    return slots


def water_fill(levels: list[int], units: int) -> list[int]:
    """Split ``units`` over bins already at ``levels`` so the fullest bin is as low as possible;
    leftovers go to the lower bins first (then the lower index). Returns units per bin."""
    order = sorted(range(len(levels)), key=lambda i: (levels[i], i))
    k, below = 1, levels[order[0]]
    while k < len(order) and levels[order[k]] * (k + 1) - (below + levels[order[k]]) <= units:
        below += levels[order[k]]
        k += 1
    base, extra = divmod(units + below, k)
    out = [0] * len(levels)
    for j, i in enumerate(order[:k]):
        out[i] = base - levels[i] + (1 if j < extra else 0)
    return out
