"""Leases: pages and a state slot held out of the scheduler's reach for an incoming request.

    reserve(n) --> Reservation --write(state)--> filled --take--> the imported request's pages + slot
                        |                                  (extra pages go back to the pool)
                        +--release--> pages and slot back (idempotent; a no-op once taken)

Live migration fills a reservation in two parts: ``write_pages`` copies full pages while the
request still decodes on its old instance (pre-copy, ``grow`` adds pages as it lengthens), then
``write(state, res, held=k)`` copies the tail: ``state.pages`` are the pages after the ``k``
already held, plus the rings and the partial state.

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
            raise InvalidRequest(
                f"cannot reserve {num_blocks} pages and a state slot: "
                f"{self.pool.num_free} pages and {self.slots.num_free} slots are free"
            )
        return Reservation(self.pool.allocate(num_blocks), self.slots.allocate())

    def release(self, res: Reservation) -> None:
        if not res.active:
            return
        res.active = False
        self.pool.free(res.blocks)
        self.slots.free(res.slot)

    def grow(self, res: Reservation, num_blocks: int) -> None:
        """Reserve more pages so that ``res`` holds at least ``num_blocks``."""
        if not res.active:
            raise InvalidRequest("the reservation was released")
        extra = num_blocks - len(res.blocks)
        if extra > self.pool.num_free:
            raise InvalidRequest(f"cannot reserve {extra} more pages: {self.pool.num_free} are free")
        if extra > 0:
            res.blocks += self.pool.allocate(extra)

    def write_pages(self, res: Reservation, start: int, pages: torch.Tensor) -> None:
        """Copy full pages ``[m, page_elems]`` fp32 into the reservation's pages ``start .. start + m``."""
        m = pages.shape[0]
        if not res.active:
            raise InvalidRequest("the reservation was released")
        if (
            pages.dim() != 2
            or pages.shape[1] != self.pool.pages.shape[1]
            or pages.dtype != self.pool.pages.dtype
        ):
            raise InvalidRequest(
                f"pages must be [m, {self.pool.pages.shape[1]}] fp32, got {list(pages.shape)}"
            )
        if start < 0 or start + m > len(res.blocks):
            raise InvalidRequest(f"pages {start}..{start + m} do not fit the {len(res.blocks)} reserved")
        if m:
            self.pool.pages[torch.tensor(res.blocks[start : start + m], dtype=torch.long)] = pages

    def write(self, state: RequestState, res: Reservation, held: int = 0) -> None:
        """Copy a state's pages, rings and partial state into the reserved memory; ``held``: pages
        the reservation already holds (pre-copied), which ``state.pages`` follow."""
        check_state(self.cfg, state, held)
        if not res.active:
            raise InvalidRequest("the reservation was released")
        n = held + state.pages.shape[0]
        if n > len(res.blocks):
            raise InvalidRequest(f"the reservation cannot hold {n} pages ({len(res.blocks)} reserved)")
        self.write_pages(res, held, state.pages)
        self.slots.rings[res.slot] = state.rings
        self.slots.partial[res.slot] = state.partial
        res.filled = True

    def take(self, state: RequestState, res: Reservation, held: int = 0) -> tuple[list[int], int]:
        """The block table and slot of ``state``'s request (written now unless already filled)."""
        if not res.filled or not res.active:
            self.write(state, res, held)
        n = held + state.pages.shape[0]
        res.active = False
        self.pool.free(res.blocks[n:])
        return res.blocks[:n], res.slot
