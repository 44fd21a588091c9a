"""Routing among replicas: each token-expert pair goes to one replica of its expert, by load.

Start from the split the placement was packed for (each expert's pairs evenly over the ranks of
its replicas), then, heaviest replicated expert first, take that expert's pairs back and
water-fill them onto its ranks given everything else: the least loaded rank gets pairs until it
reaches the next one, and so on. Each such move minimises the peak over the ranks it touches
and leaves the others alone, so the step's peak rank load never exceeds the even split's. A rank
holding two replicas of one expert counts once. Pure and deterministic: every rank computes the
same answer from the same pairs.
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
    first_slot: list[dict[int, int]] = []  # expert -> {rank: its first slot on that rank}
    share: list[list[int]] = []  # expert -> pairs per rank of first_slot, in rank order
    for e, n in enumerate(counts):
        by_rank: dict[int, int] = {}
        for s in replicas[e]:
            by_rank.setdefault(s // per_rank, s)
        first_slot.append(by_rank)
        base, extra = divmod(n, len(by_rank))
        share.append([base + (j < extra) for j in range(len(by_rank))])
        for r, k in zip(sorted(by_rank), share[e], strict=True):
            load[r] += k
    for e in sorted((e for e in range(len(counts)) if len(first_slot[e]) > 1), key=lambda e: (-counts[e], e)):
        ranks = sorted(first_slot[e])
        for r, k in zip(ranks, share[e], strict=True):
            load[r] -= k
        share[e] = water_fill([load[r] for r in ranks], counts[e])
        for r, k in zip(ranks, share[e], strict=True):
            load[r] += k
    order = experts.argsort(stable=True)
    slots = torch.empty_like(experts)
    a = 0
    for e in range(len(counts)):
        for r, n in zip(sorted(first_slot[e]), share[e], strict=True):
            slots[order[a : a + n]] = first_slot[e][r]
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
