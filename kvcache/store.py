"""BlockStore: the persistent block store - a BlockIndex over append-only segment files.

    put:     plan (index: which keys are new) -> write (writer thread: append records)
             -> commit (index insert; capacity eviction)                       -> Delta
    get:     plan (index lookup, pin segment fds) -> read (any thread: preadv + checksum)
             -> finish (drop blocks that failed; unpin)                        -> Delta
    compact: plan (a mostly-dead sealed segment, its live blocks) -> copy (writer thread)
             -> commit (point moved blocks at their copies; unlink the old file)

Each operation is split so that the kvstore role runs metadata steps on its event loop and the
I/O steps in threads; ``put`` / ``get`` / ``compact`` run the three steps in the calling thread.
Only the writer thread appends; reads are positional, so they never race with it. A segment
that is unlinked while reads are in flight keeps its open fd until the last of them finishes.

On open the index is rebuilt from the segment headers (each record says its key, class and
creation time), skipping what has expired; new writes always start a new segment, so a torn
tail from a crash is never appended to. A block that fails its checksum, or whose bytes are
gone, is a miss: it is dropped from the index and counted in ``metrics.corrupt`` / ``missing``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from dsi.kvcache.hashchain import keys_of
from dsi.kvcache.index import BlockIndex, Locations, Removed, class_code
from dsi.kvcache.ledger import SegmentLedger
from dsi.kvcache.segments import (
    HEADER_BYTES,
    FsyncPolicy,
    SegmentWriter,
    Written,
    payload_checksum,
    read_payload,
    read_run,
    scan,
    segment_ids,
    segment_path,
)

OK, CORRUPT, MISSING = 0, 1, 2


@dataclass(slots=True)
class StoreMetrics:
    puts: int = 0  # blocks offered
    stored: int = 0  # blocks written
    existed: int = 0  # blocks offered that were already stored
    hits: int = 0  # blocks read back intact
    misses: int = 0  # blocks asked for and not returned (absent, expired, corrupt, missing)
    corrupt: int = 0  # checksum mismatches (read or compaction)
    missing: int = 0  # bytes or segment file gone
    compacted_segments: int = 0
    compacted_blocks: int = 0
    bytes_written: int = 0


class Delta(NamedTuple):
    """Index changes for the CHECK replicas: ``[n, 2]`` uint64 keys."""

    added: np.ndarray
    removed: np.ndarray

    def __bool__(self) -> bool:
        return bool(len(self.added) or len(self.removed))


@dataclass(slots=True)
class PutPlan:
    keys: np.ndarray  # the new keys, [n, 2]
    records: list  # (key bytes, class, payload, created) per new key
    tclass: int


@dataclass(slots=True)
class ReadPlan:
    """One get: ``slots[i] < 0`` is a miss; ``fds[i]`` is the pinned segment fd of block i."""

    keys: np.ndarray
    slots: np.ndarray
    where: Locations
    fds: list[int]
    segments: list[int] = field(default_factory=list)  # pinned, one entry per pin


@dataclass(slots=True)
class CompactPlan:
    segment: int
    fd: int
    slots: np.ndarray
    where: Locations
    keys: np.ndarray
    tclass: list[int]
    created: list[float]
    copied: list[int] = field(default_factory=list)  # indices copied intact, by compact_copy


class BlockStore:
    def __init__(
        self,
        root: Path,
        *,
        capacity: int = 0,
        ttls_s: Mapping[str, float] | None = None,
        clock: Callable[[], float] = time.time,
        segment_bytes: int = 1 << 30,
        fsync: FsyncPolicy = "segment",
        compact_below: float = 0.5,
    ) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.index = BlockIndex(capacity, ttls_s, clock)
        self.metrics = StoreMetrics()
        self.compact_below = compact_below
        self.ledger = SegmentLedger(self.root)
        existing = segment_ids(self.root)
        self._rebuild(existing)
        self.writer = SegmentWriter(self.root, (existing[-1] + 1) if existing else 1, segment_bytes, fsync)

    # ---- put ---------------------------------------------------------------------------------
    def put_plan(self, packed: bytes, payloads: Sequence, traffic_class: str) -> PutPlan:
        keys = keys_of(packed)
        if len(keys) != len(payloads):
            raise ValueError(f"{len(keys)} hashes for {len(payloads)} payloads")
        tclass = class_code(traffic_class)
        fresh = self.index.fresh(keys)
        self.metrics.puts += len(keys)
        self.metrics.existed += len(keys) - fresh.size
        if self.index.capacity:
            fresh = fresh[: self.index.capacity]  # a chain longer than the whole store keeps its head
        if fresh.size < len(keys):  # a re-put is a use
            slots = self.index.lookup(keys)
            self.index.touch(slots[slots >= 0])
        now = self.index.clock()
        records = [
            (keys[i].tobytes(), tclass, memoryview(payloads[i]).cast("B"), now) for i in fresh.tolist()
        ]
        return PutPlan(keys[fresh], records, tclass)

    def put_write(self, plan: PutPlan) -> list[Written]:
        """Writer thread only."""
        return self.writer.append(plan.records)

    def put_commit(self, plan: PutPlan, written: list[Written]) -> Delta:
        self.metrics.bytes_written += self.ledger.written(written)
        fresh = self.index.fresh(plan.keys)  # another put may have committed the same keys
        if fresh.size == 0:
            return Delta(plan.keys[:0], plan.keys[:0])
        where = _locations([written[i] for i in fresh.tolist()])
        created = np.array([plan.records[i][3] for i in fresh.tolist()], dtype=np.float64)
        removed = self.index.insert(plan.keys[fresh], where, plan.tclass, created)
        self.ledger.add_live(where.segment, where.size)
        self.metrics.stored += fresh.size
        return Delta(plan.keys[fresh], self._account_removed(removed))

    def put(self, packed: bytes, payloads: Sequence, traffic_class: str = "chatbot") -> Delta:
        plan = self.put_plan(packed, payloads, traffic_class)
        return self.put_commit(plan, self.put_write(plan))

    # ---- get ---------------------------------------------------------------------------------
    def match(self, packed: bytes, touch: bool = False) -> int:
        """Leading blocks of the chain present (metadata only)."""
        return self.index.match_prefix(keys_of(packed), touch)

    def read_plan(self, packed: bytes) -> ReadPlan:
        keys = keys_of(packed)
        slots = self.index.lookup(keys)
        where = self.index.locate(np.maximum(slots, 0))
        plan = ReadPlan(keys, slots, where, [-1] * len(keys))
        for i in np.flatnonzero(slots >= 0).tolist():
            fd = self.ledger.pin(int(where.segment[i]))
            if fd < 0:
                slots[i] = -2  # the segment file is gone
            else:
                plan.fds[i] = fd
                plan.segments.append(int(where.segment[i]))
        return plan

    @staticmethod
    def read_one(plan: ReadPlan, i: int, dest: memoryview) -> int:
        """Any thread: block i into ``dest`` (exactly its size); OK, CORRUPT or MISSING."""
        return BlockStore.read_run(plan, [i], [dest])[0]

    @staticmethod
    def read_run(plan: ReadPlan, idx: Sequence[int], dests: Sequence[memoryview]) -> list[int]:
        """Any thread: blocks ``idx`` that lie back to back in one segment (see ``runs``), in
        one read; a status per block."""
        try:
            whole = read_run(plan.fds[idx[0]], int(plan.where.offset[idx[0]]), dests)
        except OSError:
            whole = 0
        status = [MISSING] * len(idx)
        for k in range(whole):
            i = idx[k]
            good = payload_checksum(plan.keys[i].tobytes(), dests[k]) == int(plan.where.checksum[i])
            status[k] = OK if good else CORRUPT
        return status

    @staticmethod
    def runs(plan: ReadPlan, idx: Sequence[int], longest: int) -> list[list[int]]:
        """``idx`` cut into runs of at most ``longest`` blocks stored back to back."""
        seg, off, size = plan.where.segment.tolist(), plan.where.offset.tolist(), plan.where.size.tolist()
        out: list[list[int]] = []
        for i in idx:
            last = out[-1][-1] if out else -1
            follows = (
                last >= 0
                and len(out[-1]) < longest
                and seg[i] == seg[last]
                and off[i] == off[last] + size[last] + HEADER_BYTES
            )
            if follows:
                out[-1].append(i)
            else:
                out.append([i])
        return out

    def read_finish(self, plan: ReadPlan, status: Sequence[int]) -> Delta:
        """``status[i]`` for each block read (ignored where ``slots[i] < 0``); unpins; drops failures."""
        self.read_abort(plan)
        good, gone = [], []
        for i, slot in enumerate(plan.slots.tolist()):
            code = MISSING if slot == -2 else status[i] if slot >= 0 else None
            if code == OK:
                good.append(i)
            elif code is not None:
                gone.append(i)
                self.metrics.corrupt += code == CORRUPT
                self.metrics.missing += code == MISSING
        self.metrics.hits += len(good)
        self.metrics.misses += len(plan.slots) - len(good)
        held = self.index.lookup(plan.keys[good])  # slots may have been evicted and reused meanwhile
        self.index.touch(held[held >= 0])
        removed = self.index.remove(plan.keys[gone]) if gone else self.index.remove(plan.keys[:0])
        return Delta(plan.keys[:0], self._account_removed(removed))

    def read_abort(self, plan: ReadPlan) -> None:
        """Give up a planned read without touching the index (the caller's request was bad)."""
        for seg in plan.segments:
            self.ledger.unpin(seg)
        plan.segments = []

    def get(self, packed: bytes) -> list[bytes | None]:
        """Each block's bytes, None for a miss (absent, expired, corrupt or missing)."""
        plan = self.read_plan(packed)
        out: list[bytes | None] = []
        status = []
        for i, slot in enumerate(plan.slots.tolist()):
            buf = bytearray(int(plan.where.size[i])) if slot >= 0 else None
            status.append(self.read_one(plan, i, memoryview(buf)) if buf is not None else MISSING)
            out.append(bytes(buf) if buf is not None and status[-1] == OK else None)
        self.read_finish(plan, status)
        return out

    # ---- expiry and compaction ---------------------------------------------------------------
    def expire(self) -> Delta:
        removed = self._account_removed(self.index.expire())
        return Delta(removed[:0], removed)

    def compact_plan(self) -> CompactPlan | None:
        """The sealed segment with the smallest live fraction below ``compact_below``, if any."""
        worst = self.ledger.most_dead(self.writer.active, self.compact_below)
        if worst is None:
            return None
        slots = self.index.slots_in(worst)
        fd = self.ledger.pin(worst) if slots.size else -1
        if slots.size and fd < 0:  # file gone: its blocks are lost
            self.metrics.missing += slots.size
            self._account_removed(self.index.remove(self.index.keys[slots]))
            slots = slots[:0]
        return CompactPlan(
            worst,
            fd,
            slots,
            self.index.locate(slots),
            self.index.keys[slots].copy(),
            self.index.tclass[slots].tolist(),
            self.index.created[slots].tolist(),
        )

    def compact_copy(self, plan: CompactPlan) -> list[Written]:
        """Writer thread only: copy the plan's intact blocks to the active segment."""
        records = []
        for i in range(len(plan.slots)):
            buf = memoryview(bytearray(int(plan.where.size[i])))
            key = plan.keys[i].tobytes()
            ok = read_payload(plan.fd, int(plan.where.offset[i]), buf)
            if ok and payload_checksum(key, buf) == int(plan.where.checksum[i]):
                records.append((key, plan.tclass[i], buf, plan.created[i]))
                plan.copied.append(i)
        return self.writer.append(records)

    def compact_abort(self, plan: CompactPlan) -> None:
        if plan.slots.size:
            self.ledger.unpin(plan.segment)

    def compact_commit(self, plan: CompactPlan, written: list[Written]) -> Delta:
        self.metrics.bytes_written += self.ledger.written(written)
        removed = plan.keys[:0]
        if plan.slots.size:
            self.ledger.unpin(plan.segment)
            kept = np.array(plan.copied, dtype=np.int64)
            # Blocks evicted or re-put elsewhere meanwhile keep their state; copies of them are dead.
            still = self.index.lookup(plan.keys[kept]) == plan.slots[kept]
            still &= self.index.segment[plan.slots[kept]] == plan.segment
            moved = _locations(written)
            sel = np.flatnonzero(still)
            self.index.move(plan.slots[kept[sel]], Locations(*(a[sel] for a in moved)))
            self.ledger.add_live(moved.segment[sel], moved.size[sel])
            lost = np.setdiff1d(np.arange(len(plan.slots)), kept)
            self.metrics.corrupt += lost.size
            removed = self._account_removed(self.index.remove(plan.keys[lost]))
            self.metrics.compacted_blocks += sel.size
        self.ledger.retire(plan.segment)
        self.metrics.compacted_segments += 1
        return Delta(removed[:0], removed)

    def compact(self) -> Delta:
        """Compact every segment below the threshold (synchronously)."""
        delta = Delta(np.empty((0, 2), np.uint64), np.empty((0, 2), np.uint64))
        while (plan := self.compact_plan()) is not None:
            step = self.compact_commit(plan, self.compact_copy(plan))
            delta = Delta(delta.added, np.concatenate([delta.removed, step.removed]))
        return delta

    # ---- lifecycle ---------------------------------------------------------------------------
    @property
    def segments(self) -> int:
        return len(self.ledger.total)

    @property
    def live_bytes(self) -> int:
        return self.ledger.live_bytes

    def close(self) -> None:
        self.writer.close()
        self.ledger.close()

    # ---- internals ---------------------------------------------------------------------------
    def _rebuild(self, ids: list[int]) -> None:
        now = self.index.clock()
        for seg in ids:
            keys, where, tclass, created = [], [], [], []
            end = 0
            for header, offset in scan(segment_path(self.root, seg)):
                end = offset + header.size
                keys.append(header.key)
                where.append(Written(seg, offset, header.size, header.checksum))
                tclass.append(header.tclass)
                created.append(header.created)
            size = segment_path(self.root, seg).stat().st_size
            if not size:
                segment_path(self.root, seg).unlink()
                continue
            self.ledger.total[seg] = size  # a torn or corrupt tail counts as dead bytes
            self.metrics.corrupt += end < size  # one bad record; what followed it is lost
            if not keys:
                continue
            packed = b"".join(keys)
            arr = keys_of(packed)
            tc = np.array(tclass, dtype=np.uint8)
            cr = np.array(created, dtype=np.float64)
            fresh = self.index.fresh(arr)
            fresh = fresh[tc[fresh] < len(self.index.ttl)]  # a class this version does not know
            fresh = fresh[cr[fresh] + self.index.ttl[tc[fresh]] > now]
            loc = _locations([where[i] for i in fresh.tolist()])
            self._account_removed(self.index.insert(arr[fresh], loc, tc[fresh], cr[fresh]))
            self.ledger.add_live(loc.segment, loc.size)

    def _account_removed(self, removed: Removed) -> np.ndarray:
        self.ledger.remove_live(removed.segment, removed.size)
        return removed.keys


def _locations(written: Sequence[Written]) -> Locations:
    return Locations(
        np.array([w.segment for w in written], dtype=np.uint32),
        np.array([w.offset for w in written], dtype=np.uint64),
        np.array([w.size for w in written], dtype=np.uint32),
        np.array([w.checksum for w in written], dtype=np.uint64),
    )
