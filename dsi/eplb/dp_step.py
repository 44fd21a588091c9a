"""One data-parallel step on one rank, and the results' way back to rank 0.

Every rank runs the step's forward over the slices the plan gives it (:mod:`dsi.eplb.plan`),
through every layer, also with none: its MoE layers are collectives. Then the worker ranks send
rank 0 what it needs to finish the step::

    rank r > 0                                         rank 0
    [world, 1 + L*E] int64: row 0 = (floats, counts)  --all_to_all-->  sizes, expert counts summed
    floats: hidden rows [n_r, H], then per ring        --all_to_all-->  one buffer per rank
            snapshot (local slice, B, [n_producer, 2, block, kv_heads, D])

``n_r`` (the sampled rows of rank r's slices) is known to rank 0 from the plan; the snapshots
follow in local slice order. Slice indices and positions travel as fp32 values, exact below 2**24.
"""

from __future__ import annotations

import torch

from dsi.engine.batch import StepSlice
from dsi.engine.runner import ModelRunner, Snapshots
from dsi.eplb.comm import Comm
from dsi.eplb.member import Member


def own_rows(
    runner: ModelRunner, member: Member, slices: list[StepSlice], snapshots: Snapshots | None
) -> torch.Tensor:
    """This rank's share of the step: last-layer rows [sampled rows of ``slices``, H]."""
    if slices:
        return runner.last_hidden(slices, snapshots)
    cfg = runner.cfg
    nothing = torch.empty(0, cfg.hidden)
    for layer in range(cfg.n_layers):  # no rows: the layers' all-to-alls still need this rank
        member.moe(layer, nothing)
    return nothing


def send_results(comm: Comm, hidden: torch.Tensor, snapshots: Snapshots | None, counts: torch.Tensor) -> None:
    """Collective (ranks > 0): the rows, ring snapshots and expert counts [L, E] of this rank's
    share to rank 0; the counts are zeroed (rank 0 now holds them)."""
    parts = [hidden.reshape(-1)]
    for j, (boundary, snap) in sorted((snapshots or {}).items()):
        parts += [torch.tensor([j, boundary], dtype=hidden.dtype), snap.reshape(-1).to(hidden.dtype)]
    payload = torch.cat(parts)
    sizes = torch.zeros(comm.world, 1 + counts.numel(), dtype=torch.int64)
    sizes[0, 0] = payload.numel()
    sizes[0, 1:] = counts.reshape(-1)
    comm.all_to_all(torch.empty_like(sizes), sizes)
    counts.zero_()
    comm.all_to_all(
        payload.new_empty(0), payload, [0] * comm.world, [payload.numel()] + [0] * (comm.world - 1)
    )


def gather_results(comm: Comm, counts: torch.Tensor) -> list[torch.Tensor]:
    """Collective (rank 0): each rank's float buffer (rank 0's own: empty); the workers' expert
    counts are added to ``counts`` [L, E]."""
    sizes = torch.zeros(comm.world, 1 + counts.numel(), dtype=torch.int64)
    got = torch.empty_like(sizes)
    comm.all_to_all(got, sizes)
    counts += got[1:, 1:].sum(0).view_as(counts)
    in_splits = got[:, 0].tolist()
    in_splits[0] = 0
    buf = torch.empty(sum(in_splits))
    comm.all_to_all(buf, buf.new_empty(0), in_splits, [0] * comm.world)
    return list(buf.split(in_splits))


def unpack(
    buf: torch.Tensor, rows: int, hidden: int, snapshot_shape: tuple[int, ...]
) -> tuple[torch.Tensor, Snapshots]:
    """One rank's buffer -> (rows [rows, H], snapshots by local slice index)."""
    x = buf[: rows * hidden].view(rows, hidden)
    rest, snaps = buf[rows * hidden :], {}
    n = 1
    for d in snapshot_shape:
        n *= d
    for at in range(0, rest.numel(), 2 + n):
        j, boundary = int(rest[at]), int(rest[at + 1])
        snaps[j] = (boundary, rest[at + 2 : at + 2 + n].view(snapshot_shape).clone())
    return x, snaps
