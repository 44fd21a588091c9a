"""An expert-parallel worker rank: ``python -m dsi.eplb.worker INIT_URL RANK WORLD``.

Started by :class:`dsi.eplb.group.ExpertGroup` (rank 0); runs rank 0's operations in the order it
names them until STOP, or until rank 0 goes away (its connection drops, or this process's parent
changes)."""

from __future__ import annotations

import os
import sys
import threading
import time

import torch
import torch.distributed as dist

from dsi.eplb.experts import rank0_holds_all
from dsi.eplb.group import IDLE_TIMEOUT, _set_timeout
from dsi.eplb.member import OP_CHECK, OP_MOE, OP_REBALANCE, OP_STOP, GroupSpec, Member, header, receive_dense


def main(argv: list[str]) -> int:
    init, rank, world = argv[0], int(argv[1]), int(argv[2])
    torch.set_num_threads(1)
    _exit_with_parent(os.getppid())
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    _set_timeout(IDLE_TIMEOUT)
    size = torch.empty(1, dtype=torch.int64)
    dist.broadcast(size, 0)
    blob = torch.empty(int(size), dtype=torch.uint8)
    dist.broadcast(blob, 0)
    spec = GroupSpec.from_tensor(blob)
    member = Member(rank, spec, receive_dense(spec))
    first = member.receive_placement()
    member.install(first, rank0_holds_all(spec.model.n_layers, spec.model.n_experts, world))
    hidden = spec.model.hidden
    while True:
        rows = header(world)
        op, a, b = rows[0, :3].tolist()
        if op == OP_MOE:
            member.moe(a, torch.empty(0, hidden), lambda _pairs, rows=rows: rows[:, 3])
        elif op == OP_REBALANCE:
            dist.all_reduce(member.counts)
            member.counts.zero_()
            member.install(member.receive_placement())
        elif op == OP_CHECK:
            member.check(a, b, None)
        elif op == OP_STOP:
            break
    dist.destroy_process_group()
    return 0


def _exit_with_parent(parent: int) -> None:
    """A worker never outlives the engine process that started it."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="dsi-ep-parent").start()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
