"""An expert-parallel worker rank: ``python -m dsi.eplb.worker HOST PORT RANK WORLD THREADS``.

Started by :class:`dsi.eplb.group.ExpertGroup` (rank 0, which serves the group's store at
HOST:PORT); runs the operations rank 0 names, in order, until STOP, or until rank 0 goes away
(its connections drop, or this process's parent changes)."""

from __future__ import annotations

import os
import sys
import threading
import time

import torch

from dsi.eplb.comm import Comm
from dsi.eplb.experts import rank0_holds_all
from dsi.eplb.group import IDLE_TIMEOUT
from dsi.eplb.member import OP_CHECK, OP_MOE, OP_REBALANCE, OP_STOP, GroupSpec, Member, header, receive_dense

CONNECT_S = 120.0


def main(argv: list[str]) -> int:
    host, port, rank, world, threads = argv[0], int(argv[1]), int(argv[2]), int(argv[3]), int(argv[4])
    torch.set_num_threads(threads)
    _exit_with_parent(os.getppid())
    comm = Comm.connect(host, port, rank, world, CONNECT_S, IDLE_TIMEOUT)
    size = torch.empty(1, dtype=torch.int64)
    comm.broadcast(size)
    blob = torch.empty(int(size), dtype=torch.uint8)
    comm.broadcast(blob)
    spec = GroupSpec.from_tensor(blob)
    member = Member(comm, spec, receive_dense(comm, spec))
    member.install(
        member.receive_placement(), rank0_holds_all(spec.model.n_layers, spec.model.n_experts, world)
    )
    nothing = torch.empty(0, spec.model.hidden)
    while True:
        rows = header(comm)
        op, a, b = rows[0, :3].tolist()
        if op == OP_MOE:
            member.moe(a, nothing, lambda _pairs, rows=rows: rows[:, 3])
        elif op == OP_REBALANCE:
            comm.all_reduce(member.counts)  # the pairs this rank routed itself (none in an engine)
            member.counts.zero_()
            member.install(member.receive_placement())
        elif op == OP_CHECK:
            member.check(a, b, None)
        elif op == OP_STOP:
            break
    comm.close()
    return 0


def _exit_with_parent(parent: int) -> None:
    """A worker never outlives the engine process that started it."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="dsi-ep-parent").start()


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # nothing to clean up after STOP: skip torch's slow interpreter teardown
