"""Leases: pages and a state slot held out of the scheduler's reach for an incoming request.

    reserve(n) --> Reservation --write(state)--> filled --take--> the imported request's pages + slot
                        |                                  (extra pages go back to the pool)
                        +--release--> pages and slot back (idempotent; a no-op once taken)

Reserved memory belongs to nobody else, so ``write`` may run on any thread while a step runs.
"""

from __future__ import annotations

import torch

from dsi.engine.admission import check_state
from dsi.engine.transfer import RequestState, Reservation
from dsi.errors import InvalidRequest
from dsi.kvcache.block_pool import BlockPool
from dsi.kvcache.state_slots import StateSlots
from dsi.model.config import ModelConfig


class Leases:
    def __init__(self, cfg: ModelConfig, pool: BlockPool, slots: StateSlots) -> None:
        self.cfg = cfg
        self.pool = pool
        self.slots = slots

    def reserve(self, num_blocks: int) -> Reservation:
        if num_blocks < 0 or num_blocks > self.pool.num_free or not self.slots.num_free:
            raise InvalidRequest(f"cannot reserve {num_blocks} pages and a state slot: "
                                 f"{self.pool.num_free} pages and {self.slots.num_free} slots are free")
        return Reservation(self.pool.allocate(num_blocks), self.slots.allocate())

    def release(self, res: Reservation) -> None:
        if not res.active:
            return
        res.active = False
        self.pool.free(res.blocks)
        self.slots.free(res.slot)

    def write(self, state: RequestState, res: Reservation) -> None:
        """Copy a state's pages, rings and partial state into the reserved memory."""
        check_state(self.cfg, state)
        n = state.pages.shape[0]
        if not res.active:
            raise InvalidRequest("the reservation was released")
        if n > len(res.blocks):
            raise InvalidRequest(f"the reservation cannot hold {n} pages ({len(res.blocks)} reserved)")
        self.pool.pages[torch.tensor(res.blocks[:n], dtype=torch.long)] = state.pages
        self.slots.rings[res.slot] = state.rings
        self.slots.partial[res.slot] = state.partial
        res.filled = True

    def take(self, state: RequestState, res: Reservation) -> tuple[list[int], int]:
        """The block table and slot of ``state``'s request (written now unless already filled)."""
        if not res.filled or not res.active:
            self.write(state, res)
        n = state.pages.shape[0]
        res.active = False
        self.pool.free(res.blocks[n:])
        return res.blocks[:n], res.slot
