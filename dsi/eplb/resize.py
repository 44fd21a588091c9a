"""EP sizing: slots per rank for a configured group, and the largest group the healthy ranks allow.

Each rank has memory for ``slots_per_rank`` experts per layer, fixed by the configured size:
``ceil(E / ep_size) + redundant`` (its share plus its redundant replicas). With fewer healthy
ranks the group shrinks to the largest size whose slots still hold every expert once; the
placement then has fewer redundant replicas (and serves less).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsi.eplb.placement import Placement
from dsi.eplb.policy import Policy, rebalance


@dataclass(frozen=True, slots=True)
class EpSize:
    configured: int  # ranks in the config
    healthy: int  # ranks that came up
    size: int  # ranks in the group now (<= healthy)
    slots_per_rank: int

    @property
    def capacity(self) -> float:
        """Share of the configured expert compute that serves: size / configured."""
        return self.size / self.configured


def slots_per_rank(num_experts: int, ep_size: int, redundant_per_rank: int) -> int:
    return -(-num_experts // ep_size) + redundant_per_rank


def resize(configured: int, healthy: int, num_experts: int, redundant_per_rank: int) -> EpSize:
    """The largest EP size <= ``healthy`` whose ranks hold every expert at least once.

    Raises ValueError when even every healthy rank together cannot hold the experts."""
    if configured < 1 or healthy < 0:
        raise ValueError("ep sizes must be positive")
    per_rank = slots_per_rank(num_experts, configured, redundant_per_rank)
    for size in range(min(healthy, configured), 0, -1):
        if size * per_rank >= num_experts:
            return EpSize(configured, healthy, size, per_rank)
    raise ValueError(
        f"{healthy} healthy rank(s) x {per_rank} expert slots cannot hold {num_experts} experts "
        f"(configured for {configured})"
    )


def initial_placement(
    ep: EpSize, num_layers: int, num_experts: int, policy: Policy = "global", load: torch.Tensor | None = None
) -> Placement:
    """A valid placement before any load is known (even loads), or for ``load`` [L, E]."""
    if load is None:
        load = torch.ones(num_layers, num_experts)
    return rebalance(load, ep.size, ep.slots_per_rank, policy)
