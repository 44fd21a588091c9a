"""Expert-parallel MoE: all-to-all dispatch of token-expert pairs to the ranks holding their
replicas, local expert compute, all-to-all combine. A collective: every rank of the group calls
it for the same layer, each with its own tokens (possibly none)::

    rank r:  x [T_r, H] -> route (top-k) -> pair p = t * k + j -> replica slot (by load) -> rank
             pair counts per destination            --all_to_all--> counts from each rank
             pairs sorted by destination (row + slot) --all_to_all--> rows to compute here
             expert_ffn per slot over the rows received          --all_to_all--> outputs back
             combine in expert order (dsi.model.ops.combine) + shared expert -> [T_r, H]

The combine adds a token's expert outputs in the same order as the single-process
:func:`dsi.model.ops.moe`, and with a row-invariant product each expert row is the same bits
wherever it runs: the result equals the single-process MoE.
"""

from __future__ import annotations

import torch

from dsi.eplb.comm import Comm
from dsi.eplb.experts import ExpertStore
from dsi.eplb.placement import Placement
from dsi.eplb.routing import pick_slots
from dsi.model.ops import Matmul, combine, expert_ffn, route, shared_expert


def exchange_counts(comm: Comm, send: torch.Tensor) -> torch.Tensor:
    """Collective: [world] pairs this rank sends to each rank -> [world] pairs it receives."""
    recv = torch.empty_like(send)
    comm.all_to_all(recv, send)
    return recv


def ep_moe(
    comm: Comm,
    x: torch.Tensor,
    layer: int,
    top_k: int,
    store: ExpertStore,
    placement: Placement,
    mm: Matmul,
    counts: torch.Tensor | None = None,
) -> torch.Tensor:
    """x: [T, H] normalised hidden states of this rank's tokens -> [T, H] MoE output.
    ``counts``: [E] int64, incremented by this rank's token-expert pairs per logical expert."""
    world, per_rank = placement.num_ranks, placement.slots_per_rank
    prefix = f"layers.{layer}."
    t, h = x.shape
    if t:
        top_w, top_i = route(x, store.dense[prefix + "router"], top_k, mm)
        pairs = top_i.reshape(-1)
        if counts is not None:
            counts += torch.bincount(pairs, minlength=placement.num_experts)
        slots = pick_slots(pairs, placement, layer)
    else:
        top_w = top_i = None
        slots = torch.empty(0, dtype=torch.int64)
    dest = slots // per_rank
    order = dest.argsort(stable=True)  # pairs grouped by destination rank
    out_splits = torch.bincount(dest, minlength=world)
    in_splits = exchange_counts(comm, out_splits).tolist()
    out_splits = out_splits.tolist()
    # One message per pair: its row and, in an extra column, its slot (exact in fp32 below 2**24).
    send = (
        torch.cat([x[order // top_k], slots[order, None].to(x.dtype)], dim=1) if t else x.new_empty(0, h + 1)
    )
    recv = x.new_empty(sum(in_splits), h + 1)
    comm.all_to_all(recv, send, in_splits, out_splits)
    ys = _compute(recv[:, :h], recv[:, h].long(), layer, store, placement, mm)
    back = x.new_empty(len(order), h)
    comm.all_to_all(back, ys, out_splits, in_splits)
    if not t:
        return x.new_empty(0, h)
    per_pair = torch.empty_like(back)
    per_pair[order] = back
    return combine(x, top_i, top_w, per_pair) + shared_expert(x, store.dense, prefix, mm)


def _compute(
    x: torch.Tensor, slot: torch.Tensor, layer: int, store: ExpertStore, placement: Placement, mm: Matmul
) -> torch.Tensor:
    """Rows received from every rank, each through the expert of its slot: [N, H] -> [N, H]."""
    ys = torch.empty_like(x)
    experts = placement.slot_expert[layer]
    for s in torch.unique(slot).tolist():
        idx = (slot == s).nonzero()[:, 0]
        w1, w3, w2 = store.experts[(layer, int(experts[s]))]
        ys[idx] = expert_ffn(x[idx], w1, w3, w2, mm)
    return ys
