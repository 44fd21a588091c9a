"""The two greedy steps of EPLB: replicate the heaviest experts, pack items onto bins evenly.

Pure functions over tensors (no I/O); :mod:`dsi.eplb.policy` composes them per layer.
"""

from __future__ import annotations

import torch


def replicate(load: torch.Tensor, num_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Give ``num_slots - E`` extra replicas, one at a time, to the expert whose load per replica
    is the highest (the first such expert on a tie), so the largest per-replica load is minimal.

    load: [R, E] tokens per expert (R independent rows, e.g. layers). Returns
    (slot_expert [R, num_slots]: slots 0..E-1 hold experts 0..E-1, the extra slots the chosen
    experts in the order chosen; count [R, E]: replicas per expert, each >= 1).
    """
    rows, experts = load.shape
    if num_slots < experts:
        raise ValueError(f"{num_slots} slots cannot hold {experts} experts")
    slot_expert = torch.arange(num_slots, dtype=torch.int64).repeat(rows, 1)
    count = torch.ones(rows, experts, dtype=torch.int64)
    every = torch.arange(rows)
    for s in range(experts, num_slots):
        hot = (load.double() / count).argmax(dim=-1)  # argmax takes the first maximum
        slot_expert[:, s] = hot
        count[every, hot] += 1
    return slot_expert, count


def pack(weight: torch.Tensor, num_bins: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Place N items onto ``num_bins`` bins of exactly N / num_bins items each, keeping the
    heaviest bin as light as possible: items in order of decreasing weight (stable), each onto the
    lightest bin that still has room (the lowest bin index on a tie).

    weight: [R, N]. Returns (bin [R, N], position of the item inside its bin [R, N]).
    """
    rows, items = weight.shape
    if items % num_bins:
        raise ValueError(f"{items} items do not split evenly over {num_bins} bins")
    per_bin = items // num_bins
    bins = torch.empty(rows, items, dtype=torch.int64)
    place = torch.empty(rows, items, dtype=torch.int64)
    order = weight.double().sort(dim=-1, descending=True, stable=True).indices
    for r in range(rows):
        filled = [0] * num_bins
        total = [0.0] * num_bins
        for item in order[r].tolist():
            b = min((b for b in range(num_bins) if filled[b] < per_bin), key=lambda b: total[b])
            bins[r, item], place[r, item] = b, filled[b]
            filled[b] += 1
            total[b] += float(weight[r, item])
    return bins, place
