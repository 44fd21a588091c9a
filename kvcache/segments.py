"""Append-only segment files: the on-disk format of the persistent block store.

A store directory holds ``seg-<id>.kv`` files, ids increasing. A segment is a run of
self-describing records, so the index can be rebuilt from the files alone::

    record = header (64 B) | payload (size B)

    header  0  magic "DSKV"       4  format version u16    6  kind u8 (1 = block)   7  class u8
            8  key (16 B)        24  payload size u32      28  reserved
           32  payload checksum u64 = xxh3_64(payload, seed = key_lo ^ key_hi)
           40  created f64 (wall clock seconds)            48  reserved
           56  header checksum u64 = xxh3_64(header[0:56])

The payload checksum is seeded with the key, so it also proves that the bytes belong to that
key. A segment is written by one thread (``SegmentWriter``); any thread may read
(``read_payload``), since reads and writes are positional (``os.preadv`` / ``os.pwritev``).

Fsync policy (``fsync``):
    "always"   fdatasync after each written batch, before the put is acknowledged.
    "segment"  fsync a segment when it is sealed (full) and when the writer closes; a crash
               loses at most the unsealed tail of the active segment. The default.
    "never"    the OS writes back when it likes.
Blocks are a cache: a block lost in a crash is a miss, never wrong data (checksums).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple

import xxhash

MAGIC = b"DSKV"
FORMAT_VERSION = 1
HEADER_BYTES = 64
_KIND_BLOCK = 1
_HEADER = struct.Struct("<4sHBB16sI4xQd8x")  # the first 56 bytes
_TAIL = struct.Struct("<Q")
_IOV_MAX = 1024

FsyncPolicy = Literal["always", "segment", "never"]
FSYNC_POLICIES = ("always", "segment", "never")


class RecordHeader(NamedTuple):
    key: bytes
    tclass: int
    size: int
    checksum: int
    created: float


def payload_checksum(key: bytes, payload: memoryview | bytes) -> int:
    lo, hi = struct.unpack("<QQ", key)
    return xxhash.xxh3_64_intdigest(payload, seed=lo ^ hi)


def pack_header(key: bytes, tclass: int, size: int, checksum: int, created: float) -> bytes:
    head = _HEADER.pack(MAGIC, FORMAT_VERSION, _KIND_BLOCK, tclass, key, size, checksum, created)
    return head + _TAIL.pack(xxhash.xxh3_64_intdigest(head))


def unpack_header(raw: bytes) -> RecordHeader | None:
    """The header's fields, or None when it is not a valid header (torn, corrupt, not ours)."""
    if len(raw) != HEADER_BYTES or raw[:4] != MAGIC:
        return None
    if _TAIL.unpack_from(raw, 56)[0] != xxhash.xxh3_64_intdigest(raw[:56]):
        return None
    _, version, kind, tclass, key, size, checksum, created = _HEADER.unpack_from(raw)
    if version != FORMAT_VERSION or kind != _KIND_BLOCK:
        return None
    return RecordHeader(key, tclass, size, checksum, created)


def segment_path(root: Path, seg: int) -> Path:
    return root / f"seg-{seg:08d}.kv"


def segment_ids(root: Path) -> list[int]:
    ids = []
    for path in root.glob("seg-*.kv"):
        stem = path.stem.removeprefix("seg-")
        if stem.isdigit():
            ids.append(int(stem))
    return sorted(ids)


@dataclass(slots=True, frozen=True)
class Written:
    """Where a written payload lies: ``offset`` is the payload's first byte in the segment."""

    segment: int
    offset: int
    size: int
    checksum: int


class SegmentWriter:
    """Appends records to the active segment, rolling to a new one past ``segment_bytes``."""

    def __init__(self, root: Path, first_id: int, segment_bytes: int, fsync: FsyncPolicy) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync must be one of {', '.join(FSYNC_POLICIES)}, got {fsync!r}")
        self.root = root
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.active = first_id - 1
        self.sealed: list[int] = []  # rolled since the caller last took them (see take_sealed)
        self._fd = -1
        self._size = 0
        self._open(first_id)

    @property
    def active_size(self) -> int:
        return self._size

    def append(self, records: Sequence[tuple[bytes, int, memoryview, float]]) -> list[Written]:
        """Write ``(key, tclass, payload, created)`` records in order; returns their locations.

        The records that fit the active segment go out in one ``pwritev``.
        """
        out: list[Written] = []
        parts: list = []
        start = self._size
        for key, tclass, payload, created in records:
            size = payload.nbytes
            if self._size > start and self._size + HEADER_BYTES + size > self.segment_bytes:
                _pwrite_all(self._fd, parts, start)
                parts = []
            if self._size and self._size + HEADER_BYTES + size > self.segment_bytes:
                self._roll()
                start = 0
            checksum = payload_checksum(key, payload)
            parts += [pack_header(key, tclass, size, checksum, created), payload]
            out.append(Written(self.active, self._size + HEADER_BYTES, size, checksum))
            self._size += HEADER_BYTES + size
        if parts:
            _pwrite_all(self._fd, parts, start)
        if self.fsync == "always" and out:
            os.fdatasync(self._fd)
        return out

    def take_sealed(self) -> list[int]:
        sealed, self.sealed = self.sealed, []
        return sealed

    def close(self) -> None:
        if self._fd >= 0:
            if self.fsync != "never":
                os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1

    def _roll(self) -> None:
        if self.fsync == "segment":
            os.fsync(self._fd)
        os.close(self._fd)
        self.sealed.append(self.active)
        self._open(self.active + 1)

    def _open(self, seg: int) -> None:
        self.active = seg
        self._fd = os.open(segment_path(self.root, seg), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        self._size = 0
        if self.fsync != "never":
            _fsync_dir(self.root)


def read_payload(fd: int, offset: int, dest: memoryview) -> bool:
    """Fill ``dest`` from ``offset``; False when the file is shorter (a lost tail)."""
    return read_run(fd, offset, [dest]) == 1


def read_run(fd: int, offset: int, dests: Sequence[memoryview]) -> int:
    """Payloads of consecutive records (the first payload at ``offset``) in one ``preadv``, the
    headers between them skipped; returns how many payloads were read whole."""
    scratch = memoryview(bytearray(HEADER_BYTES * max(len(dests) - 1, 0)))
    views: list[memoryview] = []
    for k, dest in enumerate(dests):
        if k:
            views.append(scratch[(k - 1) * HEADER_BYTES : k * HEADER_BYTES])
        views.append(dest)
    done = 0
    while views:
        n = os.preadv(fd, views[:_IOV_MAX], offset + done)
        if n == 0:
            break
        done += n
        _advance(views, n)
    whole, end = 0, 0
    for k, dest in enumerate(dests):
        end += (HEADER_BYTES if k else 0) + dest.nbytes
        if end > done:
            break
        whole += 1
    return whole


def scan(path: Path) -> Iterator[tuple[RecordHeader, int]]:
    """Valid records of one segment as ``(header, payload offset)``, in file order.

    Stops at the first header that is invalid or whose payload passes the end of the file: the
    torn tail of a crash, or corruption that leaves no way to find the next record.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        end = os.fstat(fd).st_size
        pos = 0
        while pos + HEADER_BYTES <= end:
            header = unpack_header(os.pread(fd, HEADER_BYTES, pos))
            if header is None or pos + HEADER_BYTES + header.size > end:
                return
            yield header, pos + HEADER_BYTES
            pos += HEADER_BYTES + header.size
    finally:
        os.close(fd)


def _pwrite_all(fd: int, parts: list, offset: int) -> None:
    views = [memoryview(p).cast("B") for p in parts]
    while views:
        n = os.pwritev(fd, views[:_IOV_MAX], offset)
        offset += n
        _advance(views, n)


def _advance(views: list[memoryview], n: int) -> None:
    """Drop the first ``n`` bytes of a list of buffers, in place."""
    done = 0
    while done < len(views) and n >= views[done].nbytes:
        n -= views[done].nbytes
        done += 1
    del views[:done]
    if views and n:
        views[0] = views[0][n:]


def _fsync_dir(root: Path) -> None:
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
