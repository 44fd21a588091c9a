"""State slots: one per running sequence, holding its SWA rings and compressor partial state.

Never paged and never persisted; moved whole on a prefill -> decode handoff or a migration.
"""

from __future__ import annotations

import torch

from dsi.model.config import ModelConfig


class NoFreeSlots(Exception):
    """Every state slot is taken; the scheduler waits."""


class StateSlots:
    """rings: [num_slots, ring_layers, 2, ring, n_kv_heads, D]; partial: [num_slots, n_sources, D].
    ``ring_layers``: the layers with a SWA branch (every layer of the V4 shape; Gemma 3's
    sliding layers, in order)."""

    def __init__(
        self,
        cfg: ModelConfig,
        num_slots: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | None = None,
    ) -> None:
        self.cfg = cfg
        self.rings = torch.zeros(
            num_slots, cfg.ring_layers, 2, cfg.ring, cfg.n_kv_heads, cfg.head_dim, dtype=dtype, device=device
        )
        self.partial = torch.zeros(num_slots, len(cfg.kv_sources), cfg.head_dim, dtype=dtype, device=device)
        self._free = list(range(num_slots - 1, -1, -1))
        self.num_slots = num_slots

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise NoFreeSlots(f"all {self.num_slots} state slots are in use")
        slot = self._free.pop()
        self.rings[slot].zero_()
        self.partial[slot].zero_()
        return slot

    def free(self, slot: int) -> None:
        if slot in self._free or not 0 <= slot < self.num_slots:
            raise ValueError(f"state slot {slot} is not in use")
        self._free.append(slot)
