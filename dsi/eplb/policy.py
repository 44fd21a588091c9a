"""EPLB policy: from per-expert loads, replicate hot experts and place replicas on ranks.

As in DeepSeek's published EPLB: ``hierarchical`` (prefill) first packs expert groups onto nodes,
so that group-limited routing keeps most traffic inside a node, then replicates and packs within
each node; ``global`` (decode) replicates and packs over all ranks regardless of groups. Pure
functions; the roles and the benchmark call the same code.

Worked example (``tests/dsi/eplb/test_policy.py``): one layer, 4 experts with loads
[10, 40, 20, 30], 2 ranks of 3 slots (2 redundant)::

    Step 1 replicate:  expert 1 (40) -> 2 replicas (20 each); then expert 3 (30) -> 2 (15 each)
                       slots [0 1 2 3 | 1 3], per-slot load [10 20 20 15 20 15]
    Step 2 pack:       slots by decreasing load (stable), each onto the lightest rank with room
                       (the lower rank on a tie): slot 1 -> r0, 2 -> r1, 4 -> r0, 3 -> r1,
                       5 -> r1, 0 -> r0
    placement:         rank 0 holds experts [1 1 0], rank 1 [2 3 3]; rank loads 50 / 50

Two replicas of one expert may land on one rank (as in DeepSeek's algorithm): the peak rank load
is what the packing minimises.
"""

from __future__ import annotations

from typing import Literal

import torch

from dsi.eplb.packing import pack, replicate
from dsi.eplb.placement import Placement

Policy = Literal["hierarchical", "global"]


def policy_for(role: str) -> Policy:
    """Prefill instances run fewer, larger EP groups with group-limited routing; decode larger ones."""
    return "hierarchical" if role == "prefill" else "global"


def rebalance(
    load: torch.Tensor,
    num_ranks: int,
    slots_per_rank: int,
    policy: Policy = "global",
    num_groups: int = 1,
    num_nodes: int = 1,
) -> Placement:
    """A placement of ``num_ranks * slots_per_rank`` slots per layer for the given loads.

    load: [L, E] tokens per logical expert over the recent window. ``hierarchical`` needs E
    divisible by ``num_groups``, ``num_groups`` by ``num_nodes`` and ``num_ranks`` by ``num_nodes``;
    otherwise (or with ``global``) one node and one group are used.
    """
    experts = load.shape[1]
    slots = num_ranks * slots_per_rank
    if slots < experts:
        raise ValueError(f"{num_ranks} ranks x {slots_per_rank} slots cannot hold {experts} experts")
    hierarchical = (
        policy == "hierarchical"
        and experts % num_groups == 0
        and num_groups % num_nodes == 0
        and num_ranks % num_nodes == 0
        and slots % num_nodes == 0
        and slots // num_nodes >= experts // num_nodes
    )
    if not hierarchical:
        num_groups = num_nodes = 1
    return Placement(
        _place(load.double(), num_ranks, slots_per_rank, num_groups, num_nodes), num_ranks, experts
    )


def _place(load: torch.Tensor, ranks: int, per_rank: int, groups: int, nodes: int) -> torch.Tensor:
    """[L, E] -> slot_expert [L, ranks * per_rank]."""
    layers, experts = load.shape
    group_size = experts // groups
    per_node = experts // nodes  # logical experts per node
    slots_per_node = ranks * per_rank // nodes
    # Step 1: pack expert groups onto nodes; node_experts[l, n * per_node + i] = logical expert id.
    group_node, group_pos = pack(load.view(layers, groups, group_size).sum(-1), nodes)
    first = (group_node * (groups // nodes) + group_pos) * group_size  # [L, G] first node-local index
    local = (first[:, :, None] + torch.arange(group_size)).reshape(layers, experts)  # expert -> node order
    node_experts = torch.empty_like(local).scatter_(1, local, torch.arange(experts).expand(layers, -1))
    # Step 2: replicate hot experts within each node.
    node_load = load.gather(1, node_experts).reshape(layers * nodes, per_node)
    slot_local, count = replicate(node_load, slots_per_node)  # [L*N, slots/N] node-local expert
    # Step 3: pack each node's slots onto its ranks, by load per replica.
    slot_load = (node_load / count).gather(1, slot_local)
    rank, pos = pack(slot_load, ranks // nodes)
    target = rank * per_rank + pos  # [L*N, slots/N] final slot inside the node
    placed = torch.empty_like(slot_local).scatter_(1, target, slot_local)
    placed = placed.view(layers, nodes, slots_per_node) + (torch.arange(nodes) * per_node)[None, :, None]
    return node_experts.gather(1, placed.reshape(layers, -1))
