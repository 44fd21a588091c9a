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

from dsi.engine.runner import ModelRunner
from dsi.eplb.arena import SharedArena
from dsi.eplb.comm import Comm
from dsi.eplb.dp_step import own_rows, send_results
from dsi.eplb.experts import rank0_holds_all
from dsi.eplb.group import IDLE_TIMEOUT
from dsi.eplb.member import (
    OP_CHECK,
    OP_FORWARD,
    OP_REBALANCE,
    OP_RUNNER,
    OP_STOP,
    GroupSpec,
    Member,
    barrier,
    broadcast_json,
    header,
    layout_from_json,
)
from dsi.eplb.plan import decode

CONNECT_S = 120.0


def main(argv: list[str]) -> int:
    host, port, rank, world, threads = argv[0], int(argv[1]), int(argv[2]), int(argv[3]), int(argv[4])
    torch.set_num_threads(threads)
    _exit_with_parent(os.getppid())
    comm = Comm.connect(host, port, rank, world, CONNECT_S, IDLE_TIMEOUT)
    spec = GroupSpec.from_json(broadcast_json(comm))
    weights = SharedArena.attach(spec.arena, list(spec.layout)).tensors
    barrier(comm)
    member = Member(comm, spec, weights)
    member.install(
        member.receive_placement(), rank0_holds_all(spec.model.n_layers, spec.model.n_experts, world)
    )
    runner: ModelRunner | None = None
    while True:
        op, a, b = header(comm)
        if op == OP_FORWARD:
            assert runner is not None, "a step before the runner"
            blob = torch.empty(a, dtype=torch.uint8)
            comm.broadcast(blob)
            snapshots = {} if b else None
            rows = own_rows(runner, member, decode(blob, rank), snapshots)
            send_results(comm, rows, snapshots, member.counts)
        elif op == OP_RUNNER:
            runner = None  # the previous runner's mappings go first
            runner = _runner(comm, member, weights, a, b)
        elif op == OP_REBALANCE:
            comm.all_reduce(member.counts)  # pairs routed outside steps (none in an engine)
            member.counts.zero_()
            member.install(member.receive_placement())
        elif op == OP_CHECK:
            member.check(a, b, None)
        elif op == OP_STOP:
            break
    comm.close()
    return 0


def _runner(
    comm: Comm, member: Member, weights: dict[str, torch.Tensor], num_blocks: int, num_slots: int
) -> ModelRunner:
    """Collective: this rank's runner over the engine's pages and state slots (shared memory)."""
    info = broadcast_json(comm)
    state = SharedArena.attach(info["arena"], layout_from_json(info["layout"])).tensors
    barrier(comm)
    cfg = member.spec.model
    runner = ModelRunner(cfg, weights, num_blocks, num_slots, info["batch_invariant"], member.moe)
    runner.use_storage(state["pages"], state["rings"], state["partial"])
    return runner


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
