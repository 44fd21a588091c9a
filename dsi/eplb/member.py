"""Member: one rank's side of an expert-parallel group - its experts, the placement, the
collective operations every rank runs in the same order (rank 0 names each one first, see
:mod:`dsi.eplb.group`)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from dsi.engine import invariant
from dsi.eplb.comm import Comm
from dsi.eplb.dispatch import CountExchange, ep_moe
from dsi.eplb.experts import ExpertStore, Held, held_by
from dsi.eplb.placement import Placement
from dsi.model.config import ModelConfig
from dsi.model.ops import Matmul, moe

# Operations rank 0 names in the header of each collective step (see header()).
OP_MOE, OP_REBALANCE, OP_CHECK, OP_STOP = 1, 2, 3, 4
DENSE = ("router", "s1", "s3", "s2")  # per-layer weights every rank holds


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """What every rank must agree on; rank 0 broadcasts it at start."""

    model: ModelConfig
    num_ranks: int
    slots_per_rank: int
    batch_invariant: bool = True

    def to_tensor(self) -> torch.Tensor:
        text = json.dumps(
            {
                "model": json.loads(self.model.to_json()),
                "num_ranks": self.num_ranks,
                "slots_per_rank": self.slots_per_rank,
                "batch_invariant": self.batch_invariant,
            }
        )
        return torch.frombuffer(bytearray(text.encode()), dtype=torch.uint8)

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> GroupSpec:
        data = json.loads(bytes(t.tolist()).decode())
        model = ModelConfig.from_json(json.dumps(data.pop("model")))
        return cls(model=model, **data)


class Member:
    def __init__(self, comm: Comm, spec: GroupSpec, dense: dict[str, torch.Tensor]) -> None:
        cfg = spec.model
        self.comm, self.rank, self.spec = comm, comm.rank, spec
        self.mm: Matmul = invariant.mm if spec.batch_invariant else torch.matmul
        self.store = ExpertStore(cfg.hidden, cfg.expert_dim, dense)
        self.placement: Placement | None = None
        self.counts = torch.zeros(cfg.n_layers, cfg.n_experts, dtype=torch.int64)  # this rank's pairs

    def moe(self, layer: int, x: torch.Tensor, exchange: CountExchange | None = None) -> torch.Tensor:
        assert self.placement is not None
        cfg = self.spec.model
        return ep_moe(
            self.comm, x, layer, cfg.top_k, self.store, self.placement, self.mm, self.counts[layer], exchange
        )

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


def header(
    comm: Comm, op: int = 0, a: int = 0, b: int = 0, pairs: torch.Tensor | None = None
) -> torch.Tensor:
    """Collective that opens every step: one all-to-all of [world, 4] int64 rows
    ``(op, a, b, pairs for that rank)``. Rank 0 names the operation (the others send op 0); an
    MoE step carries its pair counts in it, saving a separate count exchange. Returns the rows
    received, one from each rank: row 0 names the operation."""
    send = torch.zeros(comm.world, 4, dtype=torch.int64)
    send[:, 0], send[:, 1], send[:, 2] = op, a, b
    if pairs is not None:
        send[:, 3] = pairs
    recv = torch.empty_like(send)
    comm.all_to_all(recv, send)
    return recv


def receive_dense(comm: Comm, spec: GroupSpec) -> dict[str, torch.Tensor]:
    """Collective (non-zero ranks): the router and shared-expert weights, from rank 0."""
    cfg = spec.model
    shapes = {
        "router": (cfg.hidden, cfg.n_experts),
        "s1": (cfg.hidden, cfg.shared_dim),
        "s3": (cfg.hidden, cfg.shared_dim),
        "s2": (cfg.shared_dim, cfg.hidden),
    }
    dense = {}
    for i in range(cfg.n_layers):
        for name in DENSE:
            t = torch.empty(shapes[name])
            comm.broadcast(t)
            dense[f"layers.{i}.{name}"] = t
    return dense


def send_dense(comm: Comm, cfg: ModelConfig, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Collective (rank 0): the counterpart of :func:`receive_dense`."""
    dense = {}
    for i in range(cfg.n_layers):
        for name in DENSE:
            t = weights[f"layers.{i}.{name}"].contiguous()
            comm.broadcast(t)
            dense[f"layers.{i}.{name}"] = t
    return dense
