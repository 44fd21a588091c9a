"""CHECK replica: a metadata-only copy of a kvstore's key set, for prefix matches off the wire.

    kvstore --IndexDelta(epoch, seq, added, removed)--> PUB/SUB --> ReplicaState.apply
       ^                                                                  | epoch changed or
       +---------- Snapshot (stream of SnapshotChunk) <-- resync <--------+ seq != last + 1

``ReplicaState`` is the pure part (no I/O): it applies deltas in order and says when it cannot.
``CheckReplica`` connects it to a kvstore: it asks ``GetIndexInfo`` for the publisher, subscribes,
loads a snapshot, then follows deltas. Deltas older than the snapshot are skipped; a gap, a new
epoch (the kvstore restarted) or ``silence_s`` without any delta (the kvstore publishes an
empty one every ``publish_interval_s``) triggers a resync. Matches keep answering from the last
good state meanwhile: a stale hit costs a fetch miss, never wrong data.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import numpy as np
import zmq.asyncio

from dsi.errors import DsiError
from dsi.kvcache.hashchain import keys_of, pack
from dsi.kvcache.keytable import KeySet
from dsi.messages.kvstore import GetIndexInfo, IndexDelta, IndexInfo, Snapshot, SnapshotChunk
from dsi.transport.client import Peer
from dsi.transport.pubsub import Subscriber
from dsi.transport.security import CurveKeys

log = logging.getLogger(__name__)


class ReplicaState:
    """Key set + (epoch, seq) of the last delta applied; ``synced`` once a snapshot is loaded."""

    def __init__(self) -> None:
        self.keys = KeySet()
        self.epoch = -1
        self.seq = 0
        self.synced = False
        self.resyncs = 0
        self.gaps = 0

    def apply(self, delta: IndexDelta) -> bool:
        """Apply the next delta; False when it does not follow (the caller must resync)."""
        if not self.synced or delta.epoch != self.epoch:
            return False
        if delta.seq <= self.seq:
            return True  # already in the snapshot
        if delta.seq != self.seq + 1:
            self.gaps += 1
            return False
        if delta.removed:
            self.keys.remove(keys_of(pack(delta.removed)))
        if delta.added:
            self.keys.add(keys_of(pack(delta.added)))
        self.seq = delta.seq
        return True

    def load(self, chunks: list[SnapshotChunk]) -> None:
        """Replace everything with a snapshot (all chunks of one Snapshot call)."""
        keys = keys_of(b"".join(c.keys for c in chunks))
        if len(keys) != chunks[0].total:
            raise DsiError(f"snapshot has {len(keys)} keys, announced {chunks[0].total}")
        fresh = KeySet(len(keys))
        fresh.add(keys)
        self.keys = fresh
        self.epoch, self.seq = chunks[0].epoch, chunks[0].seq
        self.synced = True
        self.resyncs += 1

    def match(self, packed: bytes) -> int:
        """Leading blocks of a chain (packed hashes) the kvstore holds, as far as we know."""
        return self.keys.match_prefix(keys_of(packed)) if self.synced else 0

    def all(self) -> np.ndarray:
        return self.keys.all()


class CheckReplica:
    """Follows the kvstore at ``kvstore`` (its RPC endpoint). ``match`` never does I/O."""

    def __init__(
        self,
        kvstore: str,
        ctx: zmq.asyncio.Context,
        *,
        timeout: float = 10.0,
        silence_s: float = 5.0,
        peer_id: str = "check-replica",
        keys: CurveKeys | None = None,  # CURVE for the kvstore's RPC and its delta publisher
    ) -> None:
        self.state = ReplicaState()
        self.silence_s = silence_s
        self._ctx = ctx
        self._keys = keys
        self._peer = Peer(
            kvstore, ctx, types=(IndexInfo, SnapshotChunk), peer_id=peer_id, keys=keys, timeout=timeout
        )
        self._sub: Subscriber | None = None
        self._publish = ""
        self._task: asyncio.Task | None = None
        self._stopping = False

    def match(self, packed: bytes) -> int:
        return self.state.match(packed)

    async def start(self, timeout: float | None = None) -> None:
        """Connect, subscribe and load a first snapshot; then follow deltas in the background."""
        await self._peer.connect(timeout)
        await self._resubscribe()
        await self._resync()
        self._task = asyncio.get_running_loop().create_task(self._follow(), name="check-replica")

    async def stop(self) -> None:
        self._stopping = True  # a cancel that races a finishing recv could be lost; this is not
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._sub is not None:
            self._sub.close()
            self._sub = None
        await self._peer.close()

    async def wait_seq(self, epoch: int, seq: int, timeout: float = 10.0) -> None:
        """Until the replica has applied ``seq`` of ``epoch`` (tests and readiness checks)."""
        async with asyncio.timeout(timeout):
            while not (self.state.epoch == epoch and self.state.seq >= seq):
                await asyncio.sleep(0.01)

    # ---- internals ---------------------------------------------------------------------------
    async def _follow(self) -> None:
        while not self._stopping:
            try:
                await self._follow_once()
            except (DsiError, TimeoutError, zmq.ZMQError) as exc:
                log.warning("check replica: %r; reconnecting", exc)
                await asyncio.sleep(min(self.silence_s, 1.0))
                with contextlib.suppress(DsiError, TimeoutError, zmq.ZMQError):
                    await self._resubscribe()
                    await self._resync()

    async def _follow_once(self) -> None:
        assert self._sub is not None
        try:
            async with asyncio.timeout(self.silence_s):
                published = await self._sub.recv()
        except TimeoutError:  # the kvstore went quiet: gone, restarted elsewhere, or we lost the link
            await self._resubscribe()
            await self._resync()
            return
        if isinstance(published.msg, IndexDelta) and not self.state.apply(published.msg):
            await self._resync()

    async def _resubscribe(self) -> None:
        info = await self._peer.ask(GetIndexInfo())
        if info.publish != self._publish or self._sub is None:
            if self._sub is not None:
                self._sub.close()
            self._sub = Subscriber(
                info.publish, self._ctx, types=[IndexDelta], topics=[info.topic], keys=self._keys
            )
            self._publish = info.publish

    async def _resync(self) -> None:
        chunks = [chunk async for chunk in self._peer.stream(Snapshot())]
        self.state.load(chunks)
        log.info("check replica: %d keys as of seq %d", len(self.state.keys), self.state.seq)
