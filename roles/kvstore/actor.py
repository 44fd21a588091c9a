"""KvstoreActor: one KV store instance - a BlockStore served over RPC, its deltas published.

    PutBlock(s)  plan (loop) -> append on the writer thread -> commit (loop) -> delta -> Stored
    GetBlocks    plan (loop) -> ReadPool threads (into /dev/shm or buffers) -> finish -> BlocksRead
    MatchPrefix  index only (loop)                 GetStats / GetIndexInfo (loop)
    AnnounceStates / FindState   who holds which SWA state (memory only, bounded LRU)
    Snapshot     every key as of one seq, in chunks (a stream)
    background   every publish_interval_s: an empty delta when nothing else went out;
                 every sweep_interval_s: expiry, then compaction of mostly-dead segments

Every index change goes out as an ``IndexDelta`` on topic ``kvindex`` with the next ``seq`` of
this start's ``epoch``; metadata steps run on the event loop only, so ``seq`` and the index
always agree (a Snapshot taken between two deltas is exact as of the first).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import zmq.asyncio

from dsi.actor import handles
from dsi.config import KvstoreOptions, RoleAddresses
from dsi.config.addresses import LOOPBACK
from dsi.kvcache.hashchain import pack
from dsi.kvcache.shm import HostBuffer
from dsi.kvcache.store import OK, BlockStore, Delta
from dsi.messages.blob import Blob
from dsi.messages.kvstore import (
    AnnounceStates,
    BlocksRead,
    FindState,
    GetBlocks,
    GetIndexInfo,
    GetStats,
    IndexDelta,
    IndexInfo,
    MatchPrefix,
    PrefixMatch,
    PutBlock,
    PutBlocks,
    Snapshot,
    SnapshotChunk,
    StateLocation,
    Stored,
    StoreStats,
)
from dsi.roles.kvstore.reads import ReadPool, shm_dests
from dsi.roles.role import RoleActor
from dsi.transport.pubsub import Publisher
from dsi.transport.security import Authenticator, CurveKeys

log = logging.getLogger(__name__)

TOPIC = "kvindex"
SNAPSHOT_CHUNK_KEYS = 65536
_COMPACTIONS_PER_SWEEP = 4


class KvstoreActor(RoleActor):
    """``addresses``: where an unset ``publish`` binds (the role's bind host, an ephemeral port)
    and the host ``IndexInfo.publish`` tells (dsi.config.addresses). ``keys``: CURVE on the
    publisher, with an allow-list check of its own (the publisher has its own context)."""

    def __init__(
        self,
        name: str,
        options: KvstoreOptions,
        clock: Callable[[], float] = time.time,
        addresses: RoleAddresses = LOOPBACK,
        keys: CurveKeys | None = None,
    ) -> None:
        super().__init__(name)
        self.options = options
        self.addresses = addresses
        self.keys = keys  # the publisher's CURVE server keys (none: plain)
        self._auth: Authenticator | None = None
        self.clock = clock
        self.store_dir = options.store_dir
        self.epoch = secrets.randbits(63)
        self.seq = 0
        self.store: BlockStore | None = None
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="kvstore-write")
        self._reads: ReadPool | None = None
        self._ctx: zmq.asyncio.Context | None = None
        self._pub: Publisher | None = None
        self._quiet_since = 0.0
        self.state_owners: collections.OrderedDict[bytes, str] = collections.OrderedDict()
        self.max_state_owners = 1 << 20

    @property
    def publish_address(self) -> str:
        """Where replicas subscribe: the publisher's endpoint as others reach it."""
        return self.addresses.told(self._pub.address) if self._pub is not None else ""

    async def on_start(self) -> None:
        opts = self.options
        loop = asyncio.get_running_loop()
        # Rebuilding the index reads every segment header: off the loop.
        self.store = await loop.run_in_executor(self._writer, self._open_store)
        self._reads = ReadPool(opts.read_workers, opts.max_inflight_reads)
        self._ctx = zmq.asyncio.Context()
        if self.keys is not None:
            self._auth = Authenticator(self._ctx, self.keys)
        self._pub = Publisher(opts.publish or self.addresses.listen(), self._ctx, keys=self.keys)
        self._quiet_since = loop.time()
        self.spawn(self._keep_publishing(), name=f"{self.name}.publish")
        self.spawn(self._sweep_forever(), name=f"{self.name}.sweep")
        log.info(
            "%s: %d blocks in %s, deltas on %s",
            self.name,
            len(self.store.index),
            opts.store_dir,
            self.publish_address,
        )
        await super().on_start()

    async def on_stop(self) -> None:
        await super().on_stop()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._writer.shutdown, True)
        if self._reads is not None:
            await loop.run_in_executor(None, self._reads.close)
        if self.store is not None:
            self.store.close()
        if self._pub is not None:
            self._pub.close()
        if self._auth is not None:
            self._auth.stop()
        if self._ctx is not None:
            self._ctx.destroy(linger=0)

    # ---- handlers ----------------------------------------------------------------------------
    @handles(concurrent=True)
    async def put_blocks(self, msg: PutBlocks) -> Stored:
        return await self._put(msg.block_hashes, msg.data, msg.traffic_class)

    @handles(concurrent=True)
    async def put_block(self, msg: PutBlock) -> Stored:
        return await self._put([msg.block_hash], [msg.data], msg.traffic_class)

    @handles(concurrent=True)
    async def get_blocks(self, msg: GetBlocks) -> BlocksRead:
        store, reads = self._ready()
        plan = store.read_plan(pack(msg.block_hashes))
        buf = None
        try:
            if msg.shm_name:
                buf = HostBuffer(msg.shm_name)
                dests = shm_dests(buf, plan, msg.shm_offset, msg.stride)
            else:
                dests = [
                    memoryview(bytearray(int(size))) if slot >= 0 else None
                    for slot, size in zip(plan.slots.tolist(), plan.where.size.tolist(), strict=True)
                ]
        except (OSError, ValueError):
            store.read_abort(plan)
            if buf is not None:
                buf.close()
            raise
        try:
            status = await reads.read(plan, dests)
        except BaseException:
            store.read_abort(plan)
            raise
        self._publish(store.read_finish(plan, status))
        found = [d is not None and code == OK for d, code in zip(dests, status, strict=True)]
        sizes = [d.nbytes if ok else 0 for d, ok in zip(dests, found, strict=True)]  # type: ignore[union-attr]
        data = [] if buf is not None else [Blob(d) for d, ok in zip(dests, found, strict=True) if ok]
        dests.clear()
        if buf is not None:
            buf.close()
        return BlocksRead(found, data, sizes)

    @handles
    def match(self, msg: MatchPrefix) -> PrefixMatch:
        store, _ = self._ready()
        return PrefixMatch(store.match(pack(msg.block_hashes)))

    @handles
    def announce_states(self, msg: AnnounceStates) -> None:
        for block_hash in msg.block_hashes:
            self.state_owners.pop(block_hash, None)
            self.state_owners[block_hash] = msg.owner
        while len(self.state_owners) > self.max_state_owners:
            self.state_owners.popitem(last=False)

    @handles
    def find_state(self, msg: FindState) -> StateLocation:
        owner = self.state_owners.get(msg.block_hash)
        if owner is None:
            return StateLocation()
        self.state_owners.move_to_end(msg.block_hash)
        return StateLocation(owner)

    @handles
    def stats(self, msg: GetStats) -> StoreStats:
        store, reads = self._ready()
        m, index = store.metrics, store.index
        return StoreStats(
            blocks=len(index),
            bytes=store.live_bytes,
            hits=m.hits,
            misses=m.misses,
            corrupt=m.corrupt,
            missing=m.missing,
            puts=m.puts,
            stored=m.stored,
            expired=index.expired,
            evicted=index.evicted,
            segments=store.segments,
            compacted_segments=m.compacted_segments,
            reads_in_flight=reads.in_flight,
            seq=self.seq,
            states=len(self.state_owners),
        )

    @handles
    def index_info(self, msg: GetIndexInfo) -> IndexInfo:
        store, _ = self._ready()
        return IndexInfo(self.epoch, self.seq, self.publish_address, TOPIC, len(store.index))

    @handles
    async def snapshot(self, msg: Snapshot) -> AsyncIterator[SnapshotChunk]:
        store, _ = self._ready()
        self._publish(store.expire())  # so the snapshot holds no block already past its TTL
        keys, epoch, seq = store.index.all_keys().tobytes(), self.epoch, self.seq
        total = len(keys) // 16
        step = SNAPSHOT_CHUNK_KEYS * 16
        yield SnapshotChunk(epoch, seq, keys[:step], total)
        for start in range(step, len(keys), step):
            yield SnapshotChunk(epoch, seq, keys[start : start + step], total)

    # ---- internals ---------------------------------------------------------------------------
    def _open_store(self) -> BlockStore:
        opts = self.options
        return BlockStore(
            opts.store_dir,
            capacity=opts.capacity_blocks,
            ttls_s={"agent": opts.ttl_agent_s, "chatbot": opts.ttl_chatbot_s},
            clock=self.clock,
            segment_bytes=opts.segment_bytes,
            fsync=opts.fsync,
            compact_below=opts.compact_below,
        )

    def _ready(self) -> tuple[BlockStore, ReadPool]:
        if self.store is None or self._reads is None:
            raise RuntimeError(f"{self.name} has no open store")
        return self.store, self._reads

    async def _put(self, hashes: Sequence[bytes], data: Sequence[Blob], traffic_class: str) -> Stored:
        store, _ = self._ready()
        plan = store.put_plan(pack(hashes), [blob.buffer for blob in data], traffic_class)
        existed = len(hashes) - len(plan.records)
        if plan.records:
            written = await asyncio.get_running_loop().run_in_executor(self._writer, store.put_write, plan)
            self._publish(store.put_commit(plan, written))
        return Stored(len(plan.records), existed)

    def _publish(self, delta: Delta) -> None:
        if delta and self._pub is not None:
            self._send(IndexDelta(self.seq + 1, _split(delta.added), _split(delta.removed), self.epoch))

    def _send(self, msg: IndexDelta) -> None:
        assert self._pub is not None
        self.seq = msg.seq
        self._pub.publish(TOPIC, msg)
        self._quiet_since = asyncio.get_running_loop().time()

    async def _keep_publishing(self) -> None:
        """An empty delta after each quiet interval: a replica that lost the last one notices."""
        loop = asyncio.get_running_loop()
        interval = self.options.publish_interval_s
        while True:
            wait = self._quiet_since + interval - loop.time()
            if wait <= 0:
                self._send(IndexDelta(self.seq + 1, epoch=self.epoch))
                wait = interval
            await asyncio.sleep(wait)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.options.sweep_interval_s)
            try:
                await self.sweep()
            except OSError as exc:
                log.warning("%s: sweep failed: %r", self.name, exc)

    async def sweep(self) -> None:
        """Drop expired blocks, then compact up to a few mostly-dead segments."""
        store, _ = self._ready()
        self._publish(store.expire())
        loop = asyncio.get_running_loop()
        for _ in range(_COMPACTIONS_PER_SWEEP):
            plan = store.compact_plan()
            if plan is None:
                return
            try:
                written = await loop.run_in_executor(self._writer, store.compact_copy, plan)
            except BaseException:
                store.compact_abort(plan)
                raise
            self._publish(store.compact_commit(plan, written))


def _split(keys) -> list[bytes]:
    raw = keys.tobytes()
    return [raw[i : i + 16] for i in range(0, len(raw), 16)]
