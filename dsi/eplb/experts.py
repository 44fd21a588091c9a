"""ExpertStore: the routed-expert weights one rank holds, and moving them between ranks.

A rank keeps one copy of each (layer, logical expert) its slots name (two slots of one expert
share it), plus the replicated small weights every rank needs for its own tokens: router and
shared expert. Moving to a new placement is one all-to-all of every missing expert's weights,
taken from the lowest rank that held it before::

    plan (the same on every rank):  (src, dst, layer, expert) for each expert dst needs and lacks
    send buffer of rank r:          [w1 | w3 | w2] flattened, moves src = r by (dst, layer, expert)
    receive buffer of rank r:       the same, moves dst = r by (src, layer, expert)
"""

from __future__ import annotations

import torch

from dsi.eplb.comm import Comm
from dsi.eplb.placement import Placement

Key = tuple[int, int]  # (layer, logical expert)
Held = list[set[Key]]  # per rank


class ExpertStore:
    def __init__(self, hidden: int, expert_dim: int, dense: dict[str, torch.Tensor]) -> None:
        self.hidden, self.expert_dim = hidden, expert_dim
        self.dense = dense  # layers.{i}.router / s1 / s3 / s2: every rank's own tokens need them
        self.experts: dict[Key, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    @property
    def expert_numel(self) -> int:
        """Values of one expert's three matrices: 3 * H * F."""
        return 3 * self.hidden * self.expert_dim

    def hold_all(self, weights: dict[str, torch.Tensor], num_layers: int, num_experts: int) -> None:
        """Rank 0 before the first placement: every expert, as views of the model's weights."""
        for i in range(num_layers):
            p = f"layers.{i}."
            for e in range(num_experts):
                self.experts[(i, e)] = (weights[p + "w1"][e], weights[p + "w3"][e], weights[p + "w2"][e])

    def move(self, comm: Comm, held: Held, new: Placement) -> int:
        """Collective: every rank ends up holding what ``new`` gives it. ``held``: what each rank
        holds now. Returns the experts this rank received."""
        plan, rank = move_plan(held, new), comm.rank
        world = new.num_ranks
        n = self.expert_numel
        sends = sorted((m for m in plan if m[0] == rank), key=lambda m: (m[1], m[2], m[3]))
        recvs = sorted((m for m in plan if m[1] == rank), key=lambda m: (m[0], m[2], m[3]))
        out_splits = [n * sum(1 for m in sends if m[1] == d) for d in range(world)]
        in_splits = [n * sum(1 for m in recvs if m[0] == s) for s in range(world)]
        payload = [torch.cat([t.reshape(-1) for t in self.experts[(m[2], m[3])]]) for m in sends]
        send = torch.cat(payload) if payload else torch.empty(0)
        recv = torch.empty(sum(in_splits))
        if plan:  # the plan is the same on every rank: all take part, or none
            comm.all_to_all(recv, send, in_splits, out_splits)
        h, f = self.hidden, self.expert_dim
        for j, m in enumerate(recvs):
            flat = recv[j * n : (j + 1) * n]
            self.experts[(m[2], m[3])] = (
                flat[: h * f].view(h, f).clone(),
                flat[h * f : 2 * h * f].view(h, f).clone(),
                flat[2 * h * f :].view(f, h).clone(),
            )
        keep = keys_of(new, rank)
        for key in list(self.experts):
            if key not in keep:
                del self.experts[key]
        return len(recvs)


def keys_of(p: Placement, rank: int) -> set[Key]:
    slots = p.rank_slots(rank).tolist()
    return {(layer, e) for layer, row in enumerate(slots) for e in row}


def rank0_holds_all(num_layers: int, num_experts: int, num_ranks: int) -> Held:
    """Before the first placement: rank 0 has every expert (the model's weights), the rest none."""
    everything = {(i, e) for i in range(num_layers) for e in range(num_experts)}
    return [everything] + [set() for _ in range(num_ranks - 1)]


def held_by(p: Placement) -> Held:
    return [keys_of(p, r) for r in range(p.num_ranks)]


def move_plan(held: Held, new: Placement) -> list[tuple[int, int, int, int]]:
    """(src, dst, layer, expert) for every expert a rank needs under ``new`` and does not hold;
    the source is the lowest rank that holds it. Raises if nobody holds it."""
    plan = []
    for dst in range(new.num_ranks):
        have = held[dst] if dst < len(held) else set()
        for key in sorted(keys_of(new, dst) - have):
            src = next((r for r, keys in enumerate(held) if key in keys), None)
            if src is None:
                raise ValueError(f"layer {key[0]} expert {key[1]} is held by no rank")
            plan.append((src, dst, key[0], key[1]))
    return plan
