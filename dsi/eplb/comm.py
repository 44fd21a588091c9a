"""Comm: the collectives of one expert-parallel group over gloo.

A group owns its own ``ProcessGroupGloo`` and ``TCPStore`` (rank 0 serves the store) instead of
torch.distributed's process-wide default group, so one process may hold several groups (two
EP instances in one ``dsi-role`` process, or tests that start one group after another)."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist


class Comm:
    def __init__(self, store: dist.TCPStore, pg: dist.ProcessGroupGloo, rank: int, world: int) -> None:
        self._store, self._pg = store, pg
        self.rank, self.world = rank, world

    @classmethod
    def connect(cls, host: str, port: int, rank: int, world: int, connect_s: float, idle: timedelta) -> Comm:
        """Join the group (rank 0 serves the store at host:port); blocks until all ``world`` ranks
        are there, at most ``connect_s`` seconds. A collective may then wait up to ``idle``."""
        store = dist.TCPStore(host, port, world, rank == 0, timeout=timedelta(seconds=connect_s))
        pg = dist.ProcessGroupGloo(store, rank, world, idle)
        return cls(store, pg, rank, world)

    def all_to_all(
        self,
        out: torch.Tensor,
        inp: torch.Tensor,
        out_splits: list[int] | None = None,
        in_splits: list[int] | None = None,
    ) -> None:
        """Rows of ``inp`` go to each rank in turn (``in_splits`` rows to rank 0, ...); ``out``
        receives ``out_splits`` rows from each rank. Without splits: equal parts."""
        self._pg.alltoall_base(out, inp, out_splits or [], in_splits or []).wait()

    def broadcast(self, t: torch.Tensor, root: int = 0) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        self._pg.broadcast([t], opts).wait()

    def all_reduce(self, t: torch.Tensor) -> None:
        """In place: the sum over ranks."""
        self._pg.allreduce([t]).wait()

    def all_gather(self, out: list[torch.Tensor], t: torch.Tensor) -> None:
        self._pg.allgather([out], [t]).wait()

    def close(self) -> None:
        """Drop the group's connections (the other ranks see them close)."""
        shutdown = getattr(self._pg, "shutdown", None)
        if shutdown is not None:
            shutdown()
