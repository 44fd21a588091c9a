"""BlockStore on a real directory: restart, corruption, lost files, torn tails, compaction."""

import os

import numpy as np
import pytest

from dsi.kvcache.hashchain import HashChain, unpack
from dsi.kvcache.segments import HEADER_BYTES, segment_ids, segment_path
from dsi.kvcache.store import OK, BlockStore

DAY = 86400.0


class Clock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def chain(n_blocks: int, seed: int = 0) -> bytes:
    ids = np.random.default_rng(seed).integers(0, 129_280, size=128 * n_blocks, dtype=np.uint32)
    return HashChain(root_seed=5, block_size=128).hashes(ids)


def payloads(n: int, size: int = 3000, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed + 1000)
    return [rng.integers(0, 256, size=size, dtype=np.uint8).tobytes() for _ in range(n)]


@pytest.fixture
def clock():
    return Clock()


def open_store(path, clock, **kw) -> BlockStore:
    kw.setdefault("segment_bytes", 64 << 10)
    return BlockStore(path, clock=clock, **kw)


def test_put_get_match_and_dedupe(tmp_path, clock):
    store = open_store(tmp_path, clock)
    hashes, data = chain(8), payloads(8)
    delta = store.put(hashes, data)
    assert len(delta.added) == 8 and len(delta.removed) == 0
    assert store.match(hashes) == 8
    assert store.get(hashes) == data
    again = store.put(hashes, data)
    assert not again and store.metrics.existed == 8 and store.metrics.stored == 8
    other = chain(2, seed=1)
    assert store.get(other) == [None, None] and store.metrics.misses == 2
    store.close()


def test_hits_survive_a_restart(tmp_path, clock):
    store = open_store(tmp_path, clock, fsync="always")
    hashes, data = chain(40), payloads(40)  # 3000 B blocks in 64 KiB segments: several segments
    store.put(hashes[: 20 * 16], data[:20], "agent")
    store.put(hashes[20 * 16 :], data[20:], "chatbot")
    store.close()
    assert len(segment_ids(tmp_path)) > 1
    again = open_store(tmp_path, clock)
    assert again.match(hashes) == 40
    assert again.get(hashes) == data
    assert again.index.record(unpack(hashes)[0]).traffic_class == "agent"
    assert again.index.record(unpack(hashes)[39]).traffic_class == "chatbot"
    again.close()


def test_expiry_holds_across_a_restart(tmp_path, clock):
    store = open_store(tmp_path, clock)
    agent, chat = chain(3, seed=1), chain(3, seed=2)
    store.put(agent, payloads(3), "agent")
    store.put(chat, payloads(3), "chatbot")
    store.close()
    clock.t += 3 * DAY + 1
    again = open_store(tmp_path, clock)
    assert again.match(agent) == 0 and again.match(chat) == 3
    clock.t += 4 * DAY
    assert len(again.expire().removed) == 3 and len(again.index) == 0
    again.close()


def test_flipped_bytes_are_a_miss_and_counted(tmp_path, clock):
    store = open_store(tmp_path, clock, segment_bytes=1 << 20)
    hashes, data = chain(4), payloads(4)
    store.put(hashes, data)
    rec = store.index.record(unpack(hashes)[2])
    with open(segment_path(tmp_path, rec.segment), "r+b") as f:
        f.seek(rec.offset + 100)
        byte = f.read(1)
        f.seek(rec.offset + 100)
        f.write(bytes([byte[0] ^ 0xFF]))
    got = store.get(hashes)
    assert got[:2] == data[:2] and got[2] is None and got[3] == data[3]
    assert store.metrics.corrupt == 1
    assert store.match(hashes) == 2  # the bad block left the index
    store.close()


def test_a_deleted_segment_is_a_miss(tmp_path, clock):
    store = open_store(tmp_path, clock)
    hashes, data = chain(40), payloads(40)
    store.put(hashes, data)
    store.close()
    first = segment_ids(tmp_path)[0]
    segment_path(tmp_path, first).unlink()
    again = open_store(tmp_path, clock)
    assert again.match(hashes) == 0  # rebuilt without it
    assert again.get(hashes)[-1] == data[-1]
    again.close()
    # Deleted under a running store: the read fails, counted as missing.
    store = open_store(tmp_path / "b", clock)
    store.put(hashes, data)
    seg = store.index.record(unpack(hashes)[0]).segment
    segment_path(tmp_path / "b", seg).unlink()
    assert store.get(hashes[:16]) == [None] and store.metrics.missing == 1
    store.close()


def test_a_torn_tail_loses_only_the_torn_record(tmp_path, clock):
    store = open_store(tmp_path, clock, segment_bytes=1 << 20)
    hashes, data = chain(5), payloads(5)
    store.put(hashes, data)
    store.close()
    path = segment_path(tmp_path, segment_ids(tmp_path)[-1])
    os.truncate(path, path.stat().st_size - 10)
    again = open_store(tmp_path, clock)
    assert again.match(hashes) == 4 and again.get(hashes)[:4] == data[:4]
    assert again.metrics.corrupt == 1
    again.close()


def test_a_flipped_header_ends_its_segment_on_rebuild(tmp_path, clock):
    store = open_store(tmp_path, clock, segment_bytes=1 << 20)
    hashes, data = chain(5), payloads(5)
    store.put(hashes, data)
    header_at = store.index.record(unpack(hashes)[3]).offset - HEADER_BYTES
    store.close()
    path = segment_path(tmp_path, segment_ids(tmp_path)[-1])
    with open(path, "r+b") as f:
        f.seek(header_at + 30)
        f.write(b"\xff")
    again = open_store(tmp_path, clock)
    assert again.match(hashes) == 3 and again.get(hashes) == [*data[:3], None, None]
    assert again.metrics.corrupt == 1
    again.close()


def test_a_read_in_flight_survives_compaction_of_its_segment(tmp_path, clock):
    store = open_store(
        tmp_path, clock, capacity=12, segment_bytes=8 * (3000 + HEADER_BYTES), compact_below=0.6
    )
    first, second = chain(12, seed=1), chain(12, seed=2)
    store.put(first, payloads(12, seed=1))
    plan = store.read_plan(first[8 * 16 : 9 * 16])  # block 8 lies in the segment about to be compacted
    store.put(second[: 6 * 16], payloads(6, seed=2))
    store.compact()
    assert store.metrics.compacted_segments >= 1
    dest = memoryview(bytearray(3000))
    assert store.read_one(plan, 0, dest) == OK and bytes(dest) == payloads(12, seed=1)[8]
    store.read_finish(plan, [OK])
    store.close()


def test_compaction_rewrites_mostly_dead_segments(tmp_path, clock):
    # 8 blocks per segment; evicting the tail of the first chain leaves its second segment half dead.
    store = open_store(
        tmp_path, clock, capacity=12, segment_bytes=8 * (3000 + HEADER_BYTES), compact_below=0.6
    )
    first, second = chain(12, seed=1), chain(12, seed=2)
    store.put(first, payloads(12, seed=1), "agent")
    store.put(second[: 6 * 16], payloads(6, seed=2), "chatbot")  # evicts 6 of the first chain
    before = set(segment_ids(tmp_path))
    delta = store.compact()
    assert len(delta.removed) == 0
    assert store.metrics.compacted_segments >= 1 and not before <= set(segment_ids(tmp_path))
    assert store.get(first[: 6 * 16]) == payloads(12, seed=1)[:6]
    assert store.get(second[: 6 * 16]) == payloads(6, seed=2)
    store.close()
    # Evicted blocks still on disk come back on a rebuild, and the capacity evicts them again.
    again = open_store(tmp_path, clock, capacity=12)
    assert again.match(first) == 6 and again.match(second) == 6
    again.close()


@pytest.mark.parametrize("policy", ["always", "segment", "never"])
def test_fsync_policies_store_the_same_bytes(tmp_path, clock, policy):
    store = open_store(tmp_path, clock, fsync=policy)
    hashes, data = chain(30), payloads(30)
    store.put(hashes, data)
    store.close()
    again = open_store(tmp_path, clock, fsync=policy)
    assert again.get(hashes) == data
    again.close()
    with pytest.raises(ValueError):
        open_store(tmp_path / "x", clock, fsync="sometimes")
