"""Roles <-> kvstore: put / get / match / stats, and the index deltas CHECK replicas follow.

Block hashes are 16-byte ``BlockHash`` values (dsi.kvcache.hashchain), in chain order.

    PutBlock / PutBlocks  -> Stored          persist blocks (a batch holds at most 4,096 blobs)
    GetBlocks             -> BlocksRead      into host shared memory when ``shm_name`` is set
    MatchPrefix           -> PrefixMatch     leading blocks present (metadata only)
    GetStats              -> StoreStats
    GetIndexInfo          -> IndexInfo       where deltas are published, and the current seq
    Snapshot              => SnapshotChunk*  (a stream) every key, for a replica's resync
    AnnounceStates        (a tell)           these SWA states live on ``owner`` (host memory)
    FindState             -> StateLocation   which engine instance holds a block's SWA state

SWA state is never stored: the kvstore only remembers, in memory and bounded, which engine
instance said it holds the state at a block boundary. An entry can be stale (the owner evicted
it or died); the puller then falls back to replaying the window.

Deltas go out on the kvstore's publisher, topic ``IndexInfo.topic``, numbered ``seq`` = 1, 2, ...
within one ``epoch`` (a random id per kvstore start). A replica that sees another epoch or a
gap in ``seq`` resyncs from a Snapshot.
"""

from __future__ import annotations

from typing import Literal

from dsi.messages.base import Message
from dsi.messages.blob import Blob

TrafficClass = Literal["agent", "chatbot"]


class PutBlock(Message):
    block_hash: bytes  # 16 bytes
    data: Blob
    traffic_class: TrafficClass = "chatbot"


class PutBlocks(Message):
    block_hashes: list[bytes]
    data: list[Blob]  # one payload per hash
    traffic_class: TrafficClass = "chatbot"


class Stored(Message):
    stored: int = 0  # written now
    existed: int = 0  # already held (touched as used)


class GetBlocks(Message):
    """Read blocks; with ``shm_name`` block i lands at ``shm_offset + i * stride`` of the file
    ``/dev/shm/<shm_name>`` (which the caller created, large enough) and the reply has no data."""

    block_hashes: list[bytes]
    shm_name: str = ""  # "" = reply with blobs
    shm_offset: int = 0  # bytes
    stride: int = 0  # bytes between blocks in shared memory (>= every block's size)


class BlocksRead(Message):
    found: list[bool]
    data: list[Blob] = []  # the found blocks, in order, when no shm was given
    sizes: list[int] = []  # bytes of each block (0 where not found)


class MatchPrefix(Message):
    block_hashes: list[bytes]


class PrefixMatch(Message):
    hit_blocks: int


class GetStats(Message):
    pass


class StoreStats(Message):
    blocks: int = 0
    bytes: int = 0  # live record bytes on disk
    hits: int = 0
    misses: int = 0
    corrupt: int = 0  # blocks that failed their checksum
    missing: int = 0  # blocks whose bytes or file were gone
    puts: int = 0
    stored: int = 0
    expired: int = 0
    evicted: int = 0
    segments: int = 0
    compacted_segments: int = 0
    reads_in_flight: int = 0
    seq: int = 0
    states: int = 0  # SWA states whose holder is known (announced, memory only)


class GetIndexInfo(Message):
    pass


class IndexInfo(Message):
    epoch: int
    seq: int  # last delta published
    publish: str  # endpoint of the delta publisher
    topic: str
    blocks: int = 0


class Snapshot(Message):
    """Streamed: SnapshotChunk items, the first one carrying the epoch and seq they are as of."""


class SnapshotChunk(Message):
    epoch: int
    seq: int
    keys: bytes = b""  # packed hashes, n x 16 bytes
    total: int = 0  # keys in the whole snapshot


class IndexDelta(Message):
    """Published with a sequence number; a replica that sees a gap resyncs."""

    seq: int
    added: list[bytes] = []
    removed: list[bytes] = []
    epoch: int = 0


class AnnounceStates(Message):
    owner: str  # control-plane address of the engine instance that holds them
    block_hashes: list[bytes]  # the block ending at each state's boundary


class FindState(Message):
    block_hash: bytes


class StateLocation(Message):
    owner: str = ""  # "" = nobody announced it


KvstoreMsg = (
    PutBlock
    | PutBlocks
    | Stored
    | GetBlocks
    | BlocksRead
    | MatchPrefix
    | PrefixMatch
    | GetStats
    | StoreStats
    | GetIndexInfo
    | IndexInfo
    | Snapshot
    | SnapshotChunk
    | IndexDelta
    | AnnounceStates
    | FindState
    | StateLocation
)
KVSTORE = (
    PutBlock,
    PutBlocks,
    Stored,
    GetBlocks,
    BlocksRead,
    MatchPrefix,
    PrefixMatch,
    GetStats,
    StoreStats,
    GetIndexInfo,
    IndexInfo,
    Snapshot,
    SnapshotChunk,
    IndexDelta,
    AnnounceStates,
    FindState,
    StateLocation,
)
