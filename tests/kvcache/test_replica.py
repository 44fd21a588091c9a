"""ReplicaState: deltas in order, gaps and new epochs refused, stale deltas skipped."""

from dsi.kvcache.hashchain import HashChain, unpack
from dsi.kvcache.replica import ReplicaState
from dsi.messages.kvstore import IndexDelta, SnapshotChunk

HASHES = unpack(HashChain(block_size=128).hashes(list(range(128 * 6))))


def synced(epoch: int = 1, seq: int = 5) -> ReplicaState:
    state = ReplicaState()
    state.load([SnapshotChunk(epoch, seq, b"".join(HASHES[:2]), 3), SnapshotChunk(epoch, seq, HASHES[2], 3)])
    return state


def test_nothing_matches_before_a_snapshot_and_deltas_wait_for_one():
    state = ReplicaState()
    assert state.match(b"".join(HASHES)) == 0
    assert not state.apply(IndexDelta(1, added=HASHES[:1], epoch=1))


def test_deltas_apply_in_order_and_stale_ones_are_skipped():
    state = synced()
    packed = b"".join(HASHES)
    assert state.match(packed) == 3
    assert state.apply(IndexDelta(4, added=HASHES[3:6], epoch=1))  # older than the snapshot
    assert state.match(packed) == 3
    assert state.apply(IndexDelta(6, added=HASHES[3:5], epoch=1))
    assert state.apply(IndexDelta(7, removed=HASHES[1:2], epoch=1))
    assert state.match(packed) == 1 and len(state.keys) == 4 and state.seq == 7


def test_a_gap_or_a_new_epoch_asks_for_a_resync():
    state = synced()
    assert not state.apply(IndexDelta(7, added=HASHES[3:4], epoch=1))
    assert state.gaps == 1 and state.seq == 5
    assert not state.apply(IndexDelta(6, added=HASHES[3:4], epoch=2))
    assert state.match(b"".join(HASHES)) == 3  # unchanged until the resync
