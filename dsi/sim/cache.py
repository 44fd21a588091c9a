"""Where prefix pages are kept: one global store, or one local cache per prefill instance.

Both are the real ``BlockIndex`` (``dsi.kvcache.index``: TTL per traffic class from each
block's creation, LRU under a capacity) on the simulator's clock:

    global   one index for the cluster (dsi: a 3FS store every prefill reads); pages are
             persisted by the decode (prompt pages at the handoff, answer pages at the end)
    local    one index per prefill instance, ``capacity`` pages each (a cache in the instance's
             own memory); the prefill keeps the prompt pages it holds after its forward, and
             the decode's answer pages are out of its reach

A put follows the kvstore (``dsi.kvcache.store.KVStore.put_plan``): absent (or expired) keys are
inserted with the put's time as their creation, keys already there are touched (a re-put is a
use) and keep their creation time, so the TTL runs from the first put.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dsi.kvcache.index import DEFAULT_TTLS_S, BlockIndex, Locations, class_code


@dataclass(slots=True)
class SimClock:
    """The simulator's time, seconds; a BlockIndex reads it as its wall clock."""

    t: float = 0.0

    def __call__(self) -> float:
        return self.t


@dataclass(slots=True)
class PageCaches:
    """``scope`` "global" (one index; ``instance`` is ignored) or "local" (one per instance).
    ``capacity``: pages per index, 0 = unbounded; ``ttls_s``: traffic class -> seconds."""

    scope: str
    clock: SimClock
    capacity: int = 0
    ttls_s: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_TTLS_S))
    _indexes: dict[str, BlockIndex] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.scope not in ("global", "local"):
            raise ValueError(f"cache scope must be global or local, not {self.scope!r}")
        if self.capacity < 0:
            raise ValueError(f"capacity must be >= 0 pages, got {self.capacity}")

    def index(self, instance: str) -> BlockIndex:
        name = "" if self.scope == "global" else instance
        index = self._indexes.get(name)
        if index is None:
            index = self._indexes[name] = BlockIndex(self.capacity, self.ttls_s, self.clock)
        return index

    def stored(self, instance: str, keys: np.ndarray, touch: bool = False) -> int:
        """Leading pages of ``keys`` held (and not expired) where ``instance`` reads."""
        return self.index(instance).match_prefix(keys, touch=touch) if len(keys) else 0

    def put(self, instance: str, keys: np.ndarray, traffic_class: str) -> int:
        """Keep ``keys`` (one chain, in order: distinct) where ``instance`` writes; returns the
        pages added."""
        if not len(keys):
            return 0
        index = self.index(instance)
        slots = index.lookup(keys)
        there = slots >= 0
        if there.any():
            index.touch(slots[there])
        fresh = np.flatnonzero(~there)
        if index.capacity:
            fresh = fresh[: index.capacity]  # a chain longer than the whole cache keeps its head
        if fresh.size:
            zeros = np.zeros(fresh.size, dtype=np.uint32)
            where = Locations(zeros, zeros.astype(np.uint64), zeros, zeros.astype(np.uint64))
            index.insert(keys[fresh], where, class_code(traffic_class))
        return int(fresh.size)

    def expire(self) -> None:
        """Drop every page past its TTL (lookups already miss them)."""
        for index in self._indexes.values():
            index.expire()

    def pages(self) -> int:
        """Pages held, all indexes together."""
        return sum(len(i) for i in self._indexes.values())
