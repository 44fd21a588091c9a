"""Placement: which logical expert each physical expert slot of each MoE layer holds.

Slots are numbered rank-major; rank r holds slots ``[r * slots_per_rank, (r + 1) * slots_per_rank)``::

    slot:    0 1 2 | 3 4 5 | 6 7 8 | 9 10 11      (4 ranks, 3 slots each)
    rank:    0     | 1     | 2     | 3
    expert:  e.g. 5 0 2 | 1 5 3 | ...            (slot_expert[layer]; an expert may hold several slots)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True, eq=False)
class Placement:
    slot_expert: torch.Tensor  # [L, S] int64: the logical expert of each physical slot, per layer
    num_ranks: int
    num_experts: int  # logical experts per layer (E)

    def __post_init__(self) -> None:
        layers, slots = self.slot_expert.shape
        if self.num_ranks < 1 or slots % self.num_ranks:
            raise ValueError(f"{slots} slots do not split evenly over {self.num_ranks} ranks")
        held = torch.zeros(layers, self.num_experts, dtype=torch.int64)
        if bool((self.slot_expert < 0).any()) or bool((self.slot_expert >= self.num_experts).any()):
            raise ValueError(f"slot_expert holds an expert outside 0..{self.num_experts - 1}")
        held.scatter_add_(1, self.slot_expert, torch.ones_like(self.slot_expert))
        missing = (held == 0).nonzero()
        if len(missing):
            layer, expert = missing[0].tolist()
            raise ValueError(f"layer {layer}: expert {expert} has no replica")

    @property
    def num_layers(self) -> int:
        return self.slot_expert.shape[0]

    @property
    def num_slots(self) -> int:
        return self.slot_expert.shape[1]

    @property
    def slots_per_rank(self) -> int:
        return self.num_slots // self.num_ranks

    def replica_count(self) -> torch.Tensor:
        """[L, E] replicas per logical expert (each >= 1)."""
        count = torch.zeros(self.num_layers, self.num_experts, dtype=torch.int64)
        return count.scatter_add_(1, self.slot_expert, torch.ones_like(self.slot_expert))

    def replicas(self, layer: int) -> list[list[int]]:
        """Per logical expert, its slots in increasing order."""
        out: list[list[int]] = [[] for _ in range(self.num_experts)]
        for slot, expert in enumerate(self.slot_expert[layer].tolist()):
            out[expert].append(slot)
        return out

    def rank_slots(self, rank: int) -> torch.Tensor:
        """[L, slots_per_rank] the logical experts rank ``rank`` holds, in slot order."""
        k = self.slots_per_rank
        return self.slot_expert[:, rank * k : (rank + 1) * k]

    def rank_load(self, load: torch.Tensor) -> torch.Tensor:
        """Expected tokens per rank when each expert's tokens split evenly over its replicas.

        load: [L, E] tokens per logical expert -> [L, num_ranks]."""
        share = load.double() / self.replica_count()
        per_slot = share.gather(1, self.slot_expert)  # [L, S]
        return per_slot.view(self.num_layers, self.num_ranks, self.slots_per_rank).sum(-1)

    def to_tensor(self) -> torch.Tensor:
        """[2 + L * S] int64: (num_ranks, num_experts, slot_expert...), for a broadcast."""
        head = torch.tensor([self.num_ranks, self.num_experts], dtype=torch.int64)
        return torch.cat([head, self.slot_expert.reshape(-1)])

    @classmethod
    def from_tensor(cls, flat: torch.Tensor, num_layers: int) -> Placement:
        ranks, experts = int(flat[0]), int(flat[1])
        return cls(flat[2:].reshape(num_layers, -1).clone(), ranks, experts)


def imbalance(rank_tokens: torch.Tensor) -> float:
    """Peak over mean rank load, averaged over layers. rank_tokens: [L, num_ranks] (1.0 = even)."""
    mean = rank_tokens.double().mean(-1).clamp_min(1e-12)
    return float((rank_tokens.double().max(-1).values / mean).mean())
