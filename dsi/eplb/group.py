"""ExpertGroup: rank 0 of an expert-parallel group, living in the engine process.

Rank 0 starts ``size - 1`` worker processes (:mod:`dsi.eplb.worker`) over torch.distributed
(gloo). Every rank holds its share of the routed experts; the dense weights (embeddings,
attention, norms, router, shared expert) are one shared-memory arena all ranks map. Attention
and the other dense per-token work run data-parallel: each step's sequences are split over the
ranks (:mod:`dsi.eplb.dp_runner`), and at every MoE layer all ranks run the same collective
(:func:`dsi.eplb.dispatch.ep_moe`), each with its own rows::

    rank 0 (engine)                          rank r (worker)
    start workers, init gloo       <------>  init gloo
    GroupSpec (names the weights arena) ---> map the dense weights
    install placement (all-to-all of expert weights from rank 0)
    runner(): [RUNNER] + state arena name -> map pages / rings / partial state, own runner
    per step: [FORWARD] + plan ----------->  its slices; every layer's MoE all-to-alls together
              logits <- rows, snapshots, counts <-- its last-layer rows
    every ``rebalance_steps`` steps, between two steps:
              [REBALANCE] ---------------->  all_reduce counts, placement, move weights
    close: [STOP] ------------------------>  exit

Rebalance pauses serving for the time of that call only (measured: ``last_pause_s``).

The ranks share the host's cores: each uses ``cpu_count // size`` torch threads (at least one).
Rank 0 sets this for its whole process while the group runs and restores it on close, because
idle intra-op threads spin between the collectives and would take the cores the other ranks
need (on 2 cores, 100 MoE layers of EP = 2 took 4.6 s of rank-0 CPU with 2 threads, 0.17 s
with 1).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta

import torch

from dsi.engine.runner import ModelRunner
from dsi.eplb.arena import SharedArena, layout_of
from dsi.eplb.comm import Comm
from dsi.eplb.dp_runner import DataParallelRunner
from dsi.eplb.experts import held_by, rank0_holds_all
from dsi.eplb.member import (
    OP_CHECK,
    OP_REBALANCE,
    OP_RUNNER,
    OP_STOP,
    ROUTED,
    GroupSpec,
    Member,
    barrier,
    broadcast_json,
    header,
    layout_to_json,
)
from dsi.eplb.placement import Placement
from dsi.eplb.policy import Policy, rebalance
from dsi.eplb.resize import EpSize, initial_placement
from dsi.eplb.window import LoadWindow
from dsi.model.config import ModelConfig
from dsi.transport.ports import free_port

log = logging.getLogger(__name__)
DEVICES_ENV = "DSI_EP_DEVICES"  # CPU ranks that count as healthy devices (simulates failed ones)
IDLE_TIMEOUT = timedelta(days=7)  # workers wait for rank 0's next operation this long
HOST = "127.0.0.1"  # the group's ranks are processes of one host


def threads_per_rank(size: int) -> int:
    return max(1, (os.cpu_count() or 1) // size)


def healthy_ranks(configured: int) -> int:
    """Devices this host offers to an EP group of ``configured`` ranks: CUDA devices where CUDA
    exists, else ``DSI_EP_DEVICES`` (default: all configured) CPU processes."""
    if torch.cuda.is_available():
        return min(configured, torch.cuda.device_count())
    return min(configured, int(os.environ.get(DEVICES_ENV, configured)))


@dataclass(frozen=True, slots=True)
class EpOptions:
    ep: EpSize
    policy: Policy = "global"
    window_steps: int = 64  # steps of expert counts the rebalance looks at
    rebalance_steps: int = 0  # rebalance every this many steps (0 = only when asked)
    batch_invariant: bool = True
    start_timeout_s: float = 120.0


class ExpertGroup:
    def __init__(
        self, member: Member, workers: list[subprocess.Popen], options: EpOptions, previous_threads: int
    ) -> None:
        self._member = member
        self._previous_threads = previous_threads
        self._workers = workers
        self.options = options
        cfg = member.spec.model
        self.window = LoadWindow(cfg.n_layers, cfg.n_experts, options.window_steps)
        self.steps = 0
        self.rebalances = 0
        self.last_pause_s = 0.0
        self._runner: DataParallelRunner | None = None
        self._closed = False

    @classmethod
    def start(cls, cfg: ModelConfig, weights: dict[str, torch.Tensor], options: EpOptions) -> ExpertGroup:
        """Start the workers and the gloo group, send the shared weights and install the first
        placement (even loads). Blocking; raises if a worker does not join in time."""
        ep = options.ep
        port = free_port()
        threads = threads_per_rank(ep.size)
        argv = [sys.executable, "-m", "dsi.eplb.worker", HOST, str(port)]
        workers = [subprocess.Popen([*argv, str(r), str(ep.size), str(threads)]) for r in range(1, ep.size)]
        previous_threads = torch.get_num_threads()
        torch.set_num_threads(threads)
        comm = arena = None
        try:
            comm = Comm.connect(HOST, port, 0, ep.size, options.start_timeout_s, IDLE_TIMEOUT)
            dense = {k: t for k, t in weights.items() if k.rsplit(".", 1)[-1] not in ROUTED}
            arena = SharedArena.create(layout_of(dense))
            for k, t in dense.items():
                arena.tensors[k].copy_(t)
            spec = GroupSpec(
                cfg, ep.size, ep.slots_per_rank, options.batch_invariant, arena.name, tuple(arena.layout)
            )
            broadcast_json(comm, spec.to_json())
            barrier(comm)  # every rank mapped the arena: its file can go
            arena.unlink()
            member = Member(comm, spec, dense)
            member.store.hold_all(weights, cfg.n_layers, cfg.n_experts)
            first = initial_placement(ep, cfg.n_layers, cfg.n_experts, options.policy)
            comm.broadcast(first.to_tensor())
            member.install(first, rank0_holds_all(cfg.n_layers, cfg.n_experts, ep.size))
        except BaseException:
            if arena is not None:
                arena.unlink()
            if comm is not None:
                comm.close()
            _stop(workers, grace_s=0.0)
            torch.set_num_threads(previous_threads)
            raise
        log.info(
            "expert parallel group of %d ranks (%d configured), %d slots per rank",
            ep.size,
            ep.configured,
            ep.slots_per_rank,
        )
        return cls(member, workers, options, previous_threads)

    @property
    def placement(self) -> Placement:
        assert self._member.placement is not None
        return self._member.placement

    @property
    def size(self) -> int:
        return self.options.ep.size

    def runner(
        self,
        cfg: ModelConfig,
        weights: dict[str, torch.Tensor],
        num_blocks: int,
        num_slots: int,
        batch_invariant: bool = True,
    ) -> DataParallelRunner:
        """The engine's runner, its pages and state slots in shared memory that every rank maps,
        each step's sequences split over the ranks. One at a time: a new one retires the last."""
        local = ModelRunner(cfg, weights, num_blocks, num_slots, batch_invariant, self._member.moe)
        state = {"pages": local.pool.pages, "rings": local.slots.rings, "partial": local.slots.partial}
        arena = SharedArena.create(layout_of(state))
        try:
            header(self._member.comm, OP_RUNNER, num_blocks, num_slots)
            broadcast_json(
                self._member.comm,
                {
                    "arena": arena.name,
                    "layout": layout_to_json(arena.layout),
                    "batch_invariant": batch_invariant,
                },
            )
            barrier(self._member.comm)  # every rank mapped it
        finally:
            arena.unlink()
        local.use_storage(arena.tensors["pages"], arena.tensors["rings"], arena.tensors["partial"])
        if self._runner is not None:
            self._runner.closed = True
        self._runner = DataParallelRunner(local, self._member)
        return self._runner

    def end_step(self) -> float:
        """After a forward: the step's expert counts enter the window; every ``rebalance_steps``
        steps a rebalance runs here, before the next step. Returns its pause in seconds (0: none)."""
        self.window.push(self._member.counts)
        self._member.counts.zero_()
        self.steps += 1
        every = self.options.rebalance_steps
        return self.rebalance() if every and self.steps % every == 0 else 0.0

    def rebalance(self, load: torch.Tensor | None = None) -> float:
        """Gather the counts, compute a placement, move expert weights, switch. ``load`` [L, E]
        replaces the measured counts (tests, benchmarks). Returns the pause in seconds."""
        t0 = time.perf_counter()
        header(self._member.comm, OP_REBALANCE)
        total = self.window.total().clone()
        self._member.comm.all_reduce(total)  # the workers add the pairs they routed themselves
        ep = self.options.ep
        new = rebalance(load if load is not None else total, ep.size, ep.slots_per_rank, self.options.policy)
        self._member.comm.broadcast(new.to_tensor())
        self._member.install(new, held_by(self.placement))
        self.last_pause_s = time.perf_counter() - t0
        self.rebalances += 1
        return self.last_pause_s

    def check(self, full: dict[str, torch.Tensor], seed: int = 0, tokens: int = 16) -> float:
        """Every rank routes its own tokens (data-parallel); the largest difference from the
        single-process MoE over all layers and ranks."""
        header(self._member.comm, OP_CHECK, seed, tokens)
        return self._member.check(seed, tokens, full)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._runner is not None:
            self._runner.closed = True
        try:
            header(self._member.comm, OP_STOP)
        finally:
            self._member.comm.close()
            _stop(self._workers)
            torch.set_num_threads(self._previous_threads)


def _stop(workers: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    """Wait for each worker to exit (it does after STOP), then kill what remains."""
    for p in workers:
        try:
            p.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
