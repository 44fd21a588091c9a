"""Device block pool: fixed-size Block KV pages with refcounts and an eviction-ordered free list.

Lifecycle of a page::

    free (no hash) --allocate--> in use (ref 1..n) --full--> in use + content hash
         ^                                                        |
         +---- evicted: reused by allocate, hash dropped <-- free, hash kept (reusable by lookup)

Block 0 is the null block: it pads block tables and is never allocated. ``allocate`` takes
pages from the head of the free list (least recently freed first), so a freed page that still
carries a content hash stays findable by ``lookup`` for as long as possible.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

import torch

NULL_BLOCK = 0


class NoFreeBlocks(Exception):
    """Not enough free pages; the scheduler preempts or waits."""


class BlockPool:
    """``pages``: [num_blocks, elems] storage; ids index its first dimension."""

    def __init__(
        self,
        num_blocks: int,
        elems: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | None = None,
    ) -> None:
        if num_blocks < 2:
            raise ValueError("a block pool needs the null block and at least one more")
        self.pages = torch.zeros(num_blocks, elems, dtype=dtype, device=device)
        self.num_blocks = num_blocks
        self._ref = [0] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(1, num_blocks))
        self._hash_of: dict[int, Hashable] = {}
        self._by_hash: dict[Hashable, int] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - 1 - len(self._free)

    def ref(self, block: int) -> int:
        return self._ref[block]

    def allocate(self, n: int) -> list[int]:
        """n fresh pages (ref 1, no hash); raises NoFreeBlocks without allocating any."""
        if n > len(self._free):
            raise NoFreeBlocks(f"need {n} blocks, {len(self._free)} free")
        ids = []
        for _ in range(n):
            block, _ = self._free.popitem(last=False)
            self._drop_hash(block)
            self._ref[block] = 1
            ids.append(block)
        return ids

    def free(self, blocks: list[int]) -> None:
        """Drop one reference to each page; a page with no references joins the free tail.

        Pages are released in reverse order so that the tail of a sequence (least likely to be
        shared) is evicted before its head.
        """
        for block in reversed(blocks):
            if block == NULL_BLOCK:
                continue
            if self._ref[block] <= 0:
                raise ValueError(f"block {block} freed more often than allocated")
            self._ref[block] -= 1
            if self._ref[block] == 0:
                self._free[block] = None

    def hold(self, blocks: list[int]) -> None:
        """Take one more reference to each page in use (``free`` drops it): a page held so stays
        out of the free list while its holder reads it."""
        for block in blocks:
            if block == NULL_BLOCK:
                continue
            if self._ref[block] <= 0:
                raise ValueError(f"block {block} is free: it cannot be held")
            self._ref[block] += 1

    def set_hash(self, block: int, key: Hashable) -> None:
        """Record the content hash of a full page (first writer wins for duplicates)."""
        if key in self._by_hash:
            return
        self._drop_hash(block)
        self._hash_of[block] = key
        self._by_hash[key] = block

    def lookup(self, key: Hashable) -> int | None:
        """Take a reference to the page holding ``key`` (reviving it from the free list)."""
        block = self._by_hash.get(key)
        if block is None:
            return None
        if self._ref[block] == 0:
            del self._free[block]
        self._ref[block] += 1
        return block

    def hash_of(self, block: int) -> Hashable | None:
        return self._hash_of.get(block)

    def _drop_hash(self, block: int) -> None:
        key = self._hash_of.pop(block, None)
        if key is not None:
            del self._by_hash[key]
