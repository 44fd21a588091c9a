"""DataParallelRunner: rank 0's runner of an expert-parallel group, attention data-parallel.

The engine keeps one scheduler, one page pool and one set of state slots; their tensors live in
a shared-memory arena (:mod:`dsi.eplb.arena`) that every rank maps, so any rank can compute any
sequence of a step. Each step::

    rank 0                                            rank r > 0 (dsi.eplb.worker)
    split_rows: slices -> ranks (near-equal tokens)
    header [FORWARD, plan bytes, snapshots?]  ----->  header
    broadcast plan (slices + ranks)           ----->  plan -> its own slices
    own slices: embed, per layer norms, attention     own slices (or none), the same layers
      (pages / rings / partial state in shm), gate,
      MoE: count + row + output all-to-alls  <----->  the same all-to-alls, every layer
    gather: last-layer rows, ring snapshots,  <-----  its rows, snapshots, expert counts
            expert counts
    final norm + logits (batch order), sampling

Rank 0 alone allocates, frees, exports and imports pages and slots (between steps; the workers
touch them only inside a step). Verify slices (``num_logits > 1``) stay on rank 0: their
compressor rollback state lives in its runner.
"""

from __future__ import annotations

import torch

from dsi.engine.batch import StepSlice
from dsi.engine.prefix import ring_snapshot_shape
from dsi.engine.runner import ModelRunner, Snapshots
from dsi.eplb.dp_step import gather_results, own_rows, unpack
from dsi.eplb.member import OP_FORWARD, Member, header
from dsi.eplb.plan import encode
from dsi.eplb.rows import rank_tokens, split_rows


class DataParallelRunner:
    """What the engine uses of a runner (``pool``, ``slots``, ``forward``, ``rollback``), with each
    step's slices spread over the group's ranks."""

    def __init__(self, local: ModelRunner, member: Member) -> None:
        self.local, self._member = local, member
        self.cfg, self.pool, self.slots = local.cfg, local.pool, local.slots
        self.closed = False  # set when the group replaces or closes this runner
        self.data_parallel = True  # False: every slice on rank 0, the workers only hold experts (a baseline)
        self.last_tokens: list[int] = []  # [world] tokens each rank computed in the last step

    def rollback(self, slot: int, end: int) -> None:
        self.local.rollback(slot, end)

    @torch.no_grad()
    def forward(
        self, batch: list[StepSlice], snapshots: Snapshots | None = None, hidden: list | None = None
    ) -> torch.Tensor:
        """As :meth:`ModelRunner.forward`: logits [sampled rows, V] in batch order."""
        if self.closed:
            raise RuntimeError("this runner's expert-parallel group has a newer runner or is closed")
        _check(batch)  # before any rank starts: a rank that raised mid-step would stall the others
        member, world = self._member, self._member.comm.world
        tokens = [len(s.tokens) for s in batch]
        ranks = split_rows(tokens, world, [s.num_logits > 1 or not self.data_parallel for s in batch])
        self.last_tokens = rank_tokens(tokens, ranks, world)
        blob = encode(batch, ranks)
        header(member.comm, OP_FORWARD, blob.numel(), snapshots is not None)
        member.comm.broadcast(blob)
        mine = [j for j, r in enumerate(ranks) if r == 0]
        own_snaps: Snapshots | None = {} if snapshots is not None else None
        own = own_rows(self.local, member, [batch[j] for j in mine], own_snaps)
        bufs = gather_results(member.comm, member.counts)
        rows_of: dict[int, torch.Tensor] = {}
        for r in range(world):
            idx = mine if r == 0 else [j for j, rank in enumerate(ranks) if rank == r]
            n = [batch[j].num_logits if batch[j].sample else 0 for j in idx]
            if r == 0:
                x, snaps = own, own_snaps or {}
            else:
                x, snaps = unpack(bufs[r], sum(n), self.cfg.hidden, ring_snapshot_shape(self.cfg))
            for j, part in zip(idx, x.split(n), strict=True):
                rows_of[j] = part
            if snapshots is not None:
                snapshots.update({idx[k]: v for k, v in snaps.items()})
        sampled = [rows_of[j] for j, s in enumerate(batch) if s.sample]
        x = torch.cat(sampled) if sampled else torch.empty(0, self.cfg.hidden)
        if hidden is not None:
            hidden.append(x)
        return self.local.logits(x)


def _check(batch: list[StepSlice]) -> None:
    """What :meth:`ModelRunner.forward` refuses: sampled rows below a slice's consumer_start."""
    for s in batch:
        skip = min(max(0, s.consumer_start - s.start), len(s.tokens))
        if s.sample and len(s.tokens) - skip < s.num_logits:
            raise ValueError("a sampled slice ends before consumer_start")
