"""RegionPool: receive regions sub-allocated from a few large slabs, so a transfer costs no mmap.

::

    slab 0 (slab_bytes, kept while the pool lives)      slab 1 (one large transfer, freed when empty)
    +--------+------+-----------+--------------------+  +--------------------------------------+
    | r0     | free | r1        | free               |  | r2                                   |
    +--------+------+-----------+--------------------+  +--------------------------------------+

Each slab keeps a sorted free list of ``[start, end)`` byte ranges (first fit, neighbours merged).
Regions are page aligned, so the pages a region touches stay mapped and warm when it is reused.
A slab is whatever the backend maps: anonymous memory (tcp), a /dev/shm file (shm), a registered
memory region (rdma); ``SlabFactory`` makes one of at least the requested size.
"""

from __future__ import annotations

import bisect
import contextlib
import mmap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

ALIGN = 4096  # bytes


class Slab(Protocol):
    view: memoryview  # the slab's bytes

    def close(self) -> None: ...


SlabFactory = Callable[[int], Slab]


class AnonymousSlab:
    """Private anonymous memory, committed when made (``MAP_POPULATE`` where the platform has
    it), so that no write into a region pays for a page fault."""

    def __init__(self, nbytes: int) -> None:
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
        self._map = mmap.mmap(-1, nbytes, flags=flags)
        self.view = memoryview(self._map)

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # a caller still holds a view: the memory goes with it
            self.view.release()
            self._map.close()


@dataclass(frozen=True, slots=True)
class Region:
    """``nbytes`` at byte ``offset`` of slab number ``slab`` (``slab == -1``: an empty region)."""

    slab: int
    offset: int
    nbytes: int


class _FreeList:
    """First-fit allocation of aligned byte ranges in ``[0, capacity)``."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._starts: list[int] = [0]
        self._ends: list[int] = [capacity]

    def alloc(self, nbytes: int) -> int | None:
        size = -(-nbytes // ALIGN) * ALIGN
        for i, (start, end) in enumerate(zip(self._starts, self._ends, strict=True)):
            if end - start >= size:
                if end - start == size:
                    del self._starts[i], self._ends[i]
                else:
                    self._starts[i] = start + size
                return start
        return None

    def free(self, offset: int, nbytes: int) -> None:
        end = offset + -(-nbytes // ALIGN) * ALIGN
        i = bisect.bisect_left(self._starts, offset)
        if i > 0 and self._ends[i - 1] == offset:  # merge with the range before
            i -= 1
            self._ends[i] = end
        else:
            self._starts.insert(i, offset)
            self._ends.insert(i, end)
        if i + 1 < len(self._starts) and self._starts[i + 1] == self._ends[i]:  # and the one after
            self._ends[i] = self._ends.pop(i + 1)
            del self._starts[i + 1]

    def empty(self) -> bool:
        return self._starts == [0] and self._ends == [self.capacity]


class RegionPool:
    """Regions from slabs of ``slab_bytes``; a request larger than that gets a slab of its own."""

    def __init__(self, make_slab: SlabFactory, slab_bytes: int) -> None:
        self._make_slab = make_slab
        self.slab_bytes = slab_bytes
        self.slabs: dict[int, Slab] = {}
        self._free: dict[int, _FreeList] = {}
        self._next_slab = 0
        self.live = 0  # regions allocated and not freed
        self.live_bytes = 0

    def alloc(self, nbytes: int) -> Region:
        self.live += 1
        self.live_bytes += nbytes
        if nbytes == 0:
            return Region(-1, 0, 0)
        for number, free in self._free.items():
            offset = free.alloc(nbytes)
            if offset is not None:
                return Region(number, offset, nbytes)
        number = self._add_slab(max(self.slab_bytes, -(-nbytes // ALIGN) * ALIGN))
        offset = self._free[number].alloc(nbytes)
        assert offset == 0
        return Region(number, 0, nbytes)

    def view(self, region: Region) -> memoryview:
        if region.slab < 0:
            return memoryview(b"")
        return self.slabs[region.slab].view[region.offset : region.offset + region.nbytes]

    def free(self, region: Region) -> None:
        self.live -= 1
        self.live_bytes -= region.nbytes
        free = self._free.get(region.slab)
        if free is None:
            return  # empty region, or the pool is closed
        free.free(region.offset, region.nbytes)
        if free.empty() and region.slab != min(self._free):  # keep the first slab, drop the rest
            self._free.pop(region.slab)
            self.slabs.pop(region.slab).close()

    def close(self) -> None:
        for slab in self.slabs.values():
            slab.close()
        self.slabs.clear()
        self._free.clear()

    def _add_slab(self, nbytes: int) -> int:
        number, self._next_slab = self._next_slab, self._next_slab + 1
        self.slabs[number] = self._make_slab(nbytes)
        self._free[number] = _FreeList(nbytes)
        return number
