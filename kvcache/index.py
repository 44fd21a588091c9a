"""BlockIndex: BlockHash -> block record, with a TTL per traffic class and LRU under a capacity.

Records live in columns (one numpy array per field), indexed by slot; a ``KeyTable`` maps keys
to slots. Per block::

    key 16 B | segment 4 | offset 8 | size 4 | checksum 8 | class 1 | created 8 | last access 8 | tick 8
    = 65 B of columns + 8-16 B of hash table

Expiry: a block lives ``ttl[class]`` seconds from its creation (wall clock seconds), so the rule
holds unchanged when the index is rebuilt from the segment files after a restart. Expired blocks
are misses at once and are dropped by ``expire``.

LRU: each access stamps a tick from one counter; when an insert passes the capacity, the blocks
with the oldest ticks go, together with ``slack`` more (1/256 of the capacity) so that one O(n)
selection pays for many inserts. Within one batch the first block of a chain gets the newest
tick: a chain is evicted from its tail, never leaving children without their parent.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from dsi.kvcache.keytable import KeyTable

TRAFFIC_CLASSES = ("agent", "chatbot")
DEFAULT_TTLS_S = {"agent": 3 * 86400.0, "chatbot": 7 * 86400.0}
_GROW_START = 1024
_FIRST_CHUNK = 256


def class_code(name: str) -> int:
    try:
        return TRAFFIC_CLASSES.index(name)
    except ValueError:
        raise ValueError(
            f"unknown traffic class {name!r}; choose from {', '.join(TRAFFIC_CLASSES)}"
        ) from None


class Locations(NamedTuple):
    """Where blocks lie: one entry per block, arrays of the same length."""

    segment: np.ndarray  # uint32
    offset: np.ndarray  # uint64, bytes from the start of the segment file to the payload
    size: np.ndarray  # uint32, payload bytes
    checksum: np.ndarray  # uint64, xxh3_64 of the payload seeded with the key


class Removed(NamedTuple):
    keys: np.ndarray  # [n, 2] uint64
    segment: np.ndarray
    size: np.ndarray


@dataclass(slots=True, frozen=True)
class BlockRecord:
    key: bytes
    segment: int
    offset: int
    size: int
    checksum: int
    traffic_class: str
    created: float
    last_access: float


class BlockIndex:
    """Block metadata only (no data); single-threaded. ``capacity`` 0 = unbounded (blocks)."""

    def __init__(
        self,
        capacity: int = 0,
        ttls_s: Mapping[str, float] | None = None,
        clock: Callable[[], float] = time.time,
        expected: int = 0,
    ) -> None:
        ttls = {**DEFAULT_TTLS_S, **(ttls_s or {})}
        self.ttl = np.array([ttls[name] for name in TRAFFIC_CLASSES], dtype=np.float64)
        self.capacity = capacity
        self.slack = capacity // 256
        self.clock = clock
        self.expired = 0
        self.evicted = 0
        self._tick = 0
        size = max(_GROW_START, min(expected or _GROW_START, capacity or expected or _GROW_START))
        self._alloc(size)
        self._table = KeyTable(size)
        self._free = np.empty(0, dtype=np.int64)
        self._top = 0  # slots below this have been used at least once

    def __len__(self) -> int:
        return self._table.live

    @property
    def nbytes(self) -> int:
        """Bytes held by the index: columns, free list and hash table."""
        cols = (
            self.keys,
            self.segment,
            self.offset,
            self.size,
            self.checksum,
            self.tclass,
            self.created,
            self.last_access,
            self.tick,
        )
        return sum(c.nbytes for c in cols) + self._free.nbytes + self._table.nbytes

    # ---- queries -----------------------------------------------------------------------------
    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """``[n, 2]`` keys -> slots (-1 where absent or expired)."""
        slots = self._table.lookup(keys, self.keys)
        present = slots >= 0
        if present.any():
            live = slots[present]
            dead = self.created[live] + self.ttl[self.tclass[live]] <= self.clock()
            if dead.any():
                idx = np.flatnonzero(present)[dead]
                slots[idx] = -1
        return slots

    def match_prefix(self, keys: np.ndarray, touch: bool = False) -> int:
        """How many leading blocks of a chain are present; ``touch`` stamps them as used."""
        hit, chunk = 0, _FIRST_CHUNK
        while hit < len(keys):
            part = self.lookup(keys[hit : hit + chunk])
            misses = np.flatnonzero(part < 0)
            run = int(misses[0]) if misses.size else len(part)
            if touch and run:
                self.touch(part[:run])
            hit += run
            if misses.size:
                break
            chunk *= 4
        return hit

    def locate(self, slots: np.ndarray) -> Locations:
        return Locations(self.segment[slots], self.offset[slots], self.size[slots], self.checksum[slots])

    def record(self, key: bytes) -> BlockRecord | None:
        slot = int(self.lookup(np.frombuffer(key, dtype="<u8").reshape(1, 2))[0])
        if slot < 0:
            return None
        return BlockRecord(
            key,
            int(self.segment[slot]),
            int(self.offset[slot]),
            int(self.size[slot]),
            int(self.checksum[slot]),
            TRAFFIC_CLASSES[self.tclass[slot]],
            float(self.created[slot]),
            float(self.last_access[slot]),
        )

    def all_keys(self) -> np.ndarray:
        """Every key held (expired ones included until ``expire`` runs), ``[n, 2]`` uint64."""
        return self.keys[self._live_slots()]

    def slots_in(self, segment: int) -> np.ndarray:
        live = self._live_slots()
        return live[self.segment[live] == segment]

    # ---- updates -----------------------------------------------------------------------------
    def touch(self, slots: np.ndarray) -> None:
        """Stamp ``slots`` (in chain order) as just used; the first gets the newest tick."""
        n = len(slots)
        self.tick[slots] = np.arange(self._tick + n, self._tick, -1, dtype=np.uint64)
        self._tick += n
        self.last_access[slots] = self.clock()

    def insert(
        self,
        keys: np.ndarray,
        where: Locations,
        tclass: int | np.ndarray,
        created: float | np.ndarray | None = None,
    ) -> Removed:
        """Add absent, distinct ``keys`` (chain order); returns what capacity eviction removed."""
        n = len(keys)
        stale = self._table.lookup(keys, self.keys)  # expired copies of the same keys
        replaced = self._drop(stale[stale >= 0])
        evicted = _concat(replaced, self._make_room(n))
        slots = self._take(n)
        self.keys[slots] = keys
        self.segment[slots], self.offset[slots], self.size[slots], self.checksum[slots] = where
        self.tclass[slots] = tclass
        self.created[slots] = self.clock() if created is None else created
        self._table.insert(keys, slots, self.keys)
        self.touch(slots)
        return evicted

    def move(self, slots: np.ndarray, where: Locations) -> None:
        """Point ``slots`` at new locations (compaction copied their bytes)."""
        self.segment[slots], self.offset[slots], self.size[slots], self.checksum[slots] = where

    def remove(self, keys: np.ndarray) -> Removed:
        slots = self._table.lookup(keys, self.keys)
        return self._drop(slots[slots >= 0])

    def fresh(self, keys: np.ndarray) -> np.ndarray:
        """Indices of the keys an insert would add: absent (or expired), first of duplicates."""
        idx = np.flatnonzero(self.lookup(keys) < 0)
        if idx.size > 1:
            _, first = np.unique(keys[idx].view("V16").ravel(), return_index=True)
            idx = idx[np.sort(first)]
        return idx

    def expire(self) -> Removed:
        """Drop every block past its TTL."""
        live = self._live_slots()
        dead = live[self.created[live] + self.ttl[self.tclass[live]] <= self.clock()]
        self.expired += dead.size
        return self._drop(dead)

    # ---- internals ---------------------------------------------------------------------------
    def _make_room(self, n: int) -> Removed:
        if not self.capacity or len(self) + n <= self.capacity:
            return self._drop(np.empty(0, dtype=np.int64))
        if n > self.capacity:
            raise ValueError(f"{n} blocks cannot fit a capacity of {self.capacity}")
        count = min(len(self), len(self) + n - self.capacity + self.slack)
        live = self._live_slots()
        oldest = live[np.argpartition(self.tick[live], count - 1)[:count]] if count < live.size else live
        self.evicted += oldest.size
        return self._drop(oldest)

    def _live_slots(self) -> np.ndarray:
        return np.flatnonzero(self.tick[: self._top])  # free slots have tick 0

    def _drop(self, slots: np.ndarray) -> Removed:
        removed = Removed(self.keys[slots], self.segment[slots], self.size[slots])
        if slots.size:
            self._table.remove(slots, self.keys)
            self.tick[slots] = 0
            self._free = np.concatenate([self._free, slots])
        return removed

    def _take(self, n: int) -> np.ndarray:
        reuse = min(n, self._free.size)
        slots = self._free[self._free.size - reuse :]
        self._free = self._free[: self._free.size - reuse]
        fresh = n - reuse
        if self._top + fresh > len(self.keys):
            self._grow(self._top + fresh)
        slots = np.concatenate([slots, np.arange(self._top, self._top + fresh)])
        self._top += fresh
        return slots

    def _grow(self, need: int) -> None:
        size = len(self.keys)
        while size < need:
            size *= 2
        if self.capacity:
            size = max(need, min(size, self.capacity))
        old = (
            self.keys,
            self.segment,
            self.offset,
            self.size,
            self.checksum,
            self.tclass,
            self.created,
            self.last_access,
            self.tick,
        )
        self._alloc(size)
        for new, prev in zip(
            (
                self.keys,
                self.segment,
                self.offset,
                self.size,
                self.checksum,
                self.tclass,
                self.created,
                self.last_access,
                self.tick,
            ),
            old,
            strict=True,
        ):
            new[: len(prev)] = prev

    def _alloc(self, size: int) -> None:
        self.keys = np.zeros((size, 2), dtype=np.uint64)
        self.segment = np.zeros(size, dtype=np.uint32)
        self.offset = np.zeros(size, dtype=np.uint64)
        self.size = np.zeros(size, dtype=np.uint32)
        self.checksum = np.zeros(size, dtype=np.uint64)
        self.tclass = np.zeros(size, dtype=np.uint8)
        self.created = np.zeros(size, dtype=np.float64)
        self.last_access = np.zeros(size, dtype=np.float64)
        self.tick = np.zeros(size, dtype=np.uint64)


def _concat(a: Removed, b: Removed) -> Removed:
    return Removed(*(np.concatenate([x, y]) for x, y in zip(a, b, strict=True)))
