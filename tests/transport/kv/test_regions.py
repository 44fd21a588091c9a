"""RegionPool: aligned first-fit regions, merged free ranges, extra slabs dropped when empty."""

from __future__ import annotations

from dsi.transport.kv.parts import chunks
from dsi.transport.kv.regions import ALIGN, AnonymousSlab, RegionPool


def test_regions_are_aligned_reused_and_merged():
    pool = RegionPool(AnonymousSlab, 16 * ALIGN)
    a, b, c = pool.alloc(100), pool.alloc(ALIGN + 1), pool.alloc(ALIGN)
    assert (a.offset, b.offset, c.offset) == (0, ALIGN, 3 * ALIGN) and len(pool.slabs) == 1
    pool.view(b)[:] = b"\x07" * b.nbytes
    pool.free(a)
    pool.free(b)
    assert pool.alloc(3 * ALIGN).offset == 0  # a and b merged into one free range
    assert (pool.live, pool.live_bytes) == (2, 4 * ALIGN)


def test_a_large_request_gets_its_own_slab_which_goes_when_empty():
    pool = RegionPool(AnonymousSlab, 4 * ALIGN)
    small, big = pool.alloc(ALIGN), pool.alloc(10 * ALIGN)
    assert big.slab != small.slab and len(pool.slabs) == 2
    pool.free(big)
    assert len(pool.slabs) == 1  # the first slab stays
    pool.free(small)
    assert len(pool.slabs) == 1 and pool.live == 0
    empty = pool.alloc(0)
    assert pool.view(empty).nbytes == 0
    pool.free(empty)
    pool.close()
    assert pool.slabs == {}


def test_chunks_split_parts_at_chunk_boundaries_without_copies():
    parts = [memoryview(b"abc"), memoryview(b"defgh"), memoryview(b"ij")]
    plan = [(offset, [bytes(s) for s in slices]) for offset, slices in chunks(parts, 4)]
    assert plan == [(0, [b"abc", b"d"]), (4, [b"efgh"]), (8, [b"ij"])]
    assert chunks([], 4) == [(0, [])]
