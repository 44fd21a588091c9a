"""StateCache: the SWA states of finished work, kept in this host's memory for later hits.

An engine that computed a block boundary B keeps the producer SWA keys/values of the 128
positions before it (a ring snapshot, see dsi.engine) under the chain hash of the block that
ends at B. A later request whose prefix hit ends at B pulls it over the data plane and skips the
bounded replay - its output is then exactly the hit-free one. States are never persisted; the
cache is bounded in bytes and evicts the least recently used.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import torch


@dataclass(slots=True)
class CacheStats:
    entries: int = 0
    bytes: int = 0
    hits: int = 0
    misses: int = 0
    evicted: int = 0


class StateCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.stats = CacheStats()
        self._entries: collections.OrderedDict[bytes, tuple[int, torch.Tensor]] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, block_hash: bytes, boundary: int, rings: torch.Tensor) -> bool:
        """Keep a state (a copy the caller no longer writes); False when it cannot fit at all."""
        size = rings.numel() * rings.element_size()
        if size > self.max_bytes:
            return False
        old = self._entries.pop(block_hash, None)
        if old is not None:
            self.stats.bytes -= _nbytes(old[1])
        self._entries[block_hash] = (boundary, rings)
        self.stats.bytes += size
        while self.stats.bytes > self.max_bytes:
            _, (_, evicted) = self._entries.popitem(last=False)
            self.stats.bytes -= _nbytes(evicted)
            self.stats.evicted += 1
        self.stats.entries = len(self._entries)
        return True

    def get(self, block_hash: bytes) -> tuple[int, torch.Tensor] | None:
        found = self._entries.get(block_hash)
        if found is None:
            self.stats.misses += 1
            return None
        self._entries.move_to_end(block_hash)
        self.stats.hits += 1
        return found


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
