"""Roles <-> kvstore: put / get / match / stats, and index deltas published to CHECK replicas."""

from __future__ import annotations

from dsi.messages.base import Message
from dsi.messages.blob import Blob


class PutBlock(Message):
    block_hash: bytes  # 16 bytes
    data: Blob
    traffic_class: str = "chatbot"


class GetBlocks(Message):
    block_hashes: list[bytes]
    shm_name: str = ""  # host shared-memory segment to read into ("" = reply with blobs)


class BlocksRead(Message):
    found: list[bool]
    data: list[Blob] = []


class MatchPrefix(Message):
    block_hashes: list[bytes]


class PrefixMatch(Message):
    hit_blocks: int


class StoreStats(Message):
    blocks: int = 0
    bytes: int = 0
    hits: int = 0
    misses: int = 0
    corrupt: int = 0


class IndexDelta(Message):
    """Published with a sequence number; a replica that sees a gap resyncs."""

    seq: int
    added: list[bytes] = []
    removed: list[bytes] = []


KvstoreMsg = PutBlock | GetBlocks | BlocksRead | MatchPrefix | PrefixMatch | StoreStats | IndexDelta
KVSTORE = (PutBlock, GetBlocks, BlocksRead, MatchPrefix, PrefixMatch, StoreStats, IndexDelta)
