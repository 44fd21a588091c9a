"""Member: one rank's side of an expert-parallel group - its experts, the placement, the
collective operations every rank runs in the same order (rank 0 names each one first, see
:mod:`dsi.eplb.group`)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from dsi.engine import invariant
from dsi.eplb.arena import Entry, Layout
from dsi.eplb.comm import Comm
from dsi.eplb.dispatch import ep_moe
from dsi.eplb.experts import ExpertStore, Held, held_by
from dsi.eplb.placement import Placement
from dsi.model.config import ModelConfig
from dsi.model.ops import Matmul, moe

# Operations rank 0 names in the header of each collective step (see header()).
OP_FORWARD, OP_REBALANCE, OP_CHECK, OP_STOP, OP_RUNNER = 1, 2, 3, 4, 5
ROUTED = ("w1", "w3", "w2")  # per-layer routed-expert weights: placed on ranks, never shared whole


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """What every rank must agree on; rank 0 broadcasts it at start."""

    model: ModelConfig
    num_ranks: int
    slots_per_rank: int
    batch_invariant: bool = True
    arena: str = ""  # the weights arena (dsi.eplb.arena): every weight but the routed experts
    layout: tuple[Entry, ...] = ()

    def to_json(self) -> dict:
        return {
            "model": json.loads(self.model.to_json()),
            "num_ranks": self.num_ranks,
            "slots_per_rank": self.slots_per_rank,
            "batch_invariant": self.batch_invariant,
            "arena": self.arena,
            "layout": layout_to_json(self.layout),
        }

    @classmethod
    def from_json(cls, data: dict) -> GroupSpec:
        model = ModelConfig.from_json(json.dumps(data.pop("model")))
        return cls(model=model, **data | {"layout": tuple(layout_from_json(data["layout"]))})


def layout_to_json(layout: Layout | tuple[Entry, ...]) -> list:
    return [[e.name, list(e.shape), e.dtype] for e in layout]


def layout_from_json(data: list) -> Layout:
    return [Entry(name, tuple(shape), dtype) for name, shape, dtype in data]


def broadcast_json(comm: Comm, data: dict | None = None) -> dict:
    """Collective: rank 0's ``data`` (a JSON object) reaches every rank."""
    size = torch.zeros(1, dtype=torch.int64)
    blob = (
        torch.frombuffer(bytearray(json.dumps(data).encode()), dtype=torch.uint8) if comm.rank == 0 else None
    )
    if blob is not None:
        size[0] = blob.numel()
    comm.broadcast(size)
    if blob is None:
        blob = torch.empty(int(size), dtype=torch.uint8)
    comm.broadcast(blob)
    return json.loads(blob.numpy().tobytes().decode())


def barrier(comm: Comm) -> None:
    comm.all_reduce(torch.zeros(1))


class Member:
    def __init__(self, comm: Comm, spec: GroupSpec, dense: dict[str, torch.Tensor]) -> None:
        cfg = spec.model
        self.comm, self.rank, self.spec = comm, comm.rank, spec
        self.mm: Matmul = invariant.mm if spec.batch_invariant else torch.matmul
        self.store = ExpertStore(cfg.hidden, cfg.expert_dim, dense)
        self.placement: Placement | None = None
        self.counts = torch.zeros(cfg.n_layers, cfg.n_experts, dtype=torch.int64)  # this rank's pairs

    def moe(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Collective: this rank's rows x [T, H] (normalised, possibly none) -> [T, H]."""
        assert self.placement is not None
        cfg = self.spec.model
        return ep_moe(self.comm, x, layer, cfg.top_k, self.store, self.placement, self.mm, self.counts[layer])

    def install(self, new: Placement, held: Held | None = None) -> int:
        """Collective: move expert weights to ``new`` and switch to it; returns experts received."""
        got = self.store.move(self.comm, held if held is not None else held_by(self.placement), new)
        self.placement = new
        return got

    def receive_placement(self) -> Placement:
        cfg = self.spec.model
        flat = torch.empty(
            2 + cfg.n_layers * self.spec.num_ranks * self.spec.slots_per_rank, dtype=torch.int64
        )
        self.comm.broadcast(flat)
        return Placement.from_tensor(flat, cfg.n_layers)

    def check(self, seed: int, tokens: int, full: dict[str, torch.Tensor] | None) -> float:
        """Collective: every rank routes its own random tokens through every layer's EP MoE;
        rank 0 compares them all with the single-process MoE (``full``: all weights) and returns
        the largest difference (other ranks return 0)."""
        cfg = self.spec.model
        x = torch.randn(tokens, cfg.hidden, generator=torch.Generator().manual_seed(seed + self.rank))
        worst = 0.0
        for layer in range(cfg.n_layers):
            y = self.moe(layer, x)
            xs = [torch.empty_like(x) for _ in range(self.spec.num_ranks)]
            ys = [torch.empty_like(y) for _ in range(self.spec.num_ranks)]
            self.comm.all_gather(xs, x)
            self.comm.all_gather(ys, y)
            if full is not None:
                for xr, yr in zip(xs, ys, strict=True):
                    ref = moe(xr, full, f"layers.{layer}.", cfg, self.mm)
                    worst = max(worst, float((ref - yr).abs().max()))
        return worst


def header(comm: Comm, op: int = 0, a: int = 0, b: int = 0) -> tuple[int, int, int]:
    """Collective that opens every operation: rank 0 broadcasts ``(op, a, b)``; every rank
    returns them."""
    t = torch.tensor([op, a, b], dtype=torch.int64)
    comm.broadcast(t)
    op, a, b = t.tolist()
    return op, a, b
