"""KvstoreClient: how the prefill and decode roles use the kvstore - match, fetch, put.

    match(hashes)              MatchPrefix                      -> leading hit blocks
    fetch(hashes, block_bytes) GetBlocks into a pooled HostBuffer -> FetchedBlocks [n, block_bytes]
    put(hashes, blocks)        PutBlocks, in batches              -> Stored (summed)
    put_background(...)        bounded queue -> one writer task -> put()

The kvstore is a cache, so every failure (down, timeout, overloaded, a corrupt or missing block)
becomes a miss or a dropped put: counted in ``stats``, logged, never raised into the request
that asked. While the connection is down, and for ``retry_s`` after a timeout, the client
answers "miss" at once instead of waiting out a timeout per call; meanwhile it asks the
controller where the kvstore is now (a restarted one may have another address).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq.asyncio

from dsi.errors import AskTimeout, DsiError, PeerLost
from dsi.messages import ALL
from dsi.messages.blob import Blob
from dsi.messages.control import InstanceInfo, ListInstances
from dsi.messages.kvstore import (
    AnnounceStates,
    BlocksRead,
    FindState,
    GetBlocks,
    MatchPrefix,
    PutBlocks,
    StateLocation,
    Stored,
)
from dsi.roles.kvstore.shmpool import ShmPool
from dsi.transport.client import Peer
from dsi.transport.security import CurveKeys

log = logging.getLogger(__name__)

MAX_BATCH_BLOCKS = 4096  # blob frames one message may carry (transport.wire)
_UNREACHABLE = (AskTimeout, PeerLost)  # the kvstore itself is away: stop asking for a while


async def find_kvstore(controller: Peer, timeout: float = 2.0) -> str | None:
    """The address of the first serving kvstore the controller lists (by instance id), or None."""
    table = await controller.ask(ListInstances("kvstore"), timeout=timeout)
    return kvstore_address(table.instances)


def kvstore_address(instances: Iterable[InstanceInfo]) -> str | None:
    """The address of the first serving kvstore among ``instances`` (by instance id), or None."""
    ready = sorted(
        (i for i in instances if i.role == "kvstore" and i.state == "serving"), key=lambda i: i.instance_id
    )
    return ready[0].address if ready else None


@dataclass(slots=True)
class _Queued:
    """One item of the background queue: a put (``blocks`` given) or an announcement of the SWA
    states ``owner`` holds at the blocks of ``hashes`` (``blocks`` None)."""

    hashes: list[bytes]
    blocks: list[Any] | None
    traffic_class: str = "chatbot"
    owner: str = ""


@dataclass(slots=True)
class ClientStats:
    """Counts since start. ``puts`` / ``put_blocks``: PutBlocks acknowledged and their blocks;
    ``dropped``: blocks of background puts dropped because the queue was full (or on close)."""

    matches: int = 0
    match_errors: int = 0
    puts: int = 0
    put_blocks: int = 0
    put_errors: int = 0
    dropped: int = 0
    fetches: int = 0
    fetched_blocks: int = 0
    fetch_errors: int = 0
    unavailable: int = 0  # calls answered as a miss without asking (no kvstore, or retry_s not over)
    announced: int = 0  # SWA states announced (sent; a tell is not acknowledged)


class FetchedBlocks:
    """The leading run of blocks found: ``blocks`` is ``[n, block_bytes]`` uint8 in host shared
    memory (n may be 0). Valid until ``release()``, after which the memory is reused."""

    __slots__ = ("_release", "block_bytes", "blocks")

    def __init__(self, blocks: np.ndarray, release: Callable[[], None] | None = None) -> None:
        self.blocks = blocks
        self.block_bytes = blocks.shape[1]
        self._release = release

    @classmethod
    def empty(cls, block_bytes: int) -> FetchedBlocks:
        return cls(np.empty((0, block_bytes), np.uint8))

    def __len__(self) -> int:
        return self.blocks.shape[0]

    def torch(self) -> Any:
        """The same memory as a ``torch.uint8`` tensor ``[n, block_bytes]`` (no copy)."""
        import torch

        return torch.from_numpy(self.blocks)

    def release(self) -> None:
        if self._release is not None:
            release, self._release = self._release, None
            self.blocks = self.blocks[:0]
            release()

    def __enter__(self) -> FetchedBlocks:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()


class KvstoreClient:
    """Finds the kvstore through the controller (role "kvstore") unless ``address`` is given.

    ``timeout_s`` bounds a put or fetch call, ``match_timeout_s`` a match; ``max_fetches`` fetches
    run at once (each holds one shm buffer); ``max_queued_blocks`` bounds ``put_background``.
    """

    def __init__(
        self,
        controller: str | None,
        ctx: zmq.asyncio.Context,
        *,
        address: str | None = None,
        keys: CurveKeys | None = None,
        peer_id: str = "kvstore-client",
        timeout_s: float = 5.0,
        match_timeout_s: float = 1.0,
        retry_s: float = 1.0,
        max_fetches: int = 4,
        max_queued_blocks: int = 4096,
        max_batch_bytes: int = 64 << 20,
    ) -> None:
        if controller is None and address is None:
            raise ValueError("a KvstoreClient needs a controller or a kvstore address")
        self.stats = ClientStats()
        self.timeout_s, self.match_timeout_s, self.retry_s = timeout_s, match_timeout_s, retry_s
        self.max_queued_blocks, self.max_batch_bytes = max_queued_blocks, max_batch_bytes
        self._ctx, self._keys, self._peer_id = ctx, keys, peer_id
        self._fixed = address
        self._address: str | None = None
        self._controller = (
            Peer(controller, ctx, types=ALL, peer_id=peer_id, keys=keys, timeout=2.0)
            if controller is not None and address is None
            else None
        )
        self._peer: Peer | None = None
        self._shm = ShmPool(keep_free=max_fetches)
        self._fetch_slots = asyncio.Semaphore(max_fetches)
        self._down_until = 0.0  # loop time before which calls are answered as misses
        self._resolved_at = -1e9
        self._tasks: set[asyncio.Task] = set()
        self._queue: collections.deque[_Queued] = collections.deque()
        self._queued_blocks = 0
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._writer: asyncio.Task | None = None

    @property
    def address(self) -> str | None:
        """The kvstore in use (None while none is known)."""
        return self._address

    async def start(self) -> None:
        if self._fixed is not None:
            await self._switch(self._fixed)
        else:
            assert self._controller is not None
            self._spawn(self._controller.connect())
            await self._resolve()
            if self._peer is None:  # roles start together: keep asking until the kvstore registers
                self._spawn(self._find_first())
        self._writer = asyncio.get_running_loop().create_task(
            self._write_forever(), name="kvstore-client.put"
        )

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.cancel()
            await asyncio.gather(self._writer, return_exceptions=True)
        self.stats.dropped += self._queued_blocks
        self._queue.clear()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._peer is not None:
            await self._peer.close()
        if self._controller is not None:
            await self._controller.close()
        self._shm.close()

    # ---- calls -------------------------------------------------------------------------------
    async def match(self, hashes: Sequence[bytes]) -> int:
        """Leading blocks of the chain the kvstore holds; 0 when it cannot be asked."""
        peer = self._usable()
        if peer is None or not hashes:
            return 0
        try:
            reply = await peer.ask(MatchPrefix(list(hashes)), timeout=self.match_timeout_s)
        except DsiError as exc:
            self.stats.match_errors += 1
            self._failed(peer, "match", exc)
            return 0
        self.stats.matches += 1
        return reply.hit_blocks

    async def fetch(self, hashes: Sequence[bytes], block_bytes: int) -> FetchedBlocks:
        """Read the blocks of ``hashes`` (each ``block_bytes`` long) into shared memory; the
        leading run found, stopping at the first block missing, corrupt or of another size."""
        if block_bytes < 1:
            raise ValueError(f"block_bytes must be >= 1, got {block_bytes}")
        peer = self._usable()
        if peer is None or not hashes:
            return FetchedBlocks.empty(block_bytes)
        async with self._fetch_slots:
            buf = self._shm.acquire(len(hashes) * block_bytes)
            try:
                read: BlocksRead = await peer.ask(
                    GetBlocks(list(hashes), buf.name, 0, block_bytes), timeout=self.timeout_s
                )
            except DsiError as exc:
                self._shm.discard(buf)
                self.stats.fetch_errors += 1
                self._failed(peer, "fetch", exc)
                return FetchedBlocks.empty(block_bytes)
            except BaseException:  # cancelled: the kvstore may still be writing into it
                self._shm.discard(buf)
                raise
        n = leading_run(read, block_bytes)
        self.stats.fetches += 1
        self.stats.fetched_blocks += n
        if n == 0:
            self._shm.release(buf)
            return FetchedBlocks.empty(block_bytes)
        blocks = buf.numpy()[: n * block_bytes].reshape(n, block_bytes)
        return FetchedBlocks(blocks, lambda: self._shm.release(buf))

    async def put(
        self, hashes: Sequence[bytes], blocks: Sequence[Any], traffic_class: str = "chatbot"
    ) -> Stored:
        """Persist blocks (bytes-like, numpy arrays or CPU tensors) in batches of at most 4,096 blocks and ``max_batch_bytes``;
        the counts of what was acknowledged (a failed batch ends the put)."""
        if len(hashes) != len(blocks):
            raise ValueError(f"{len(hashes)} hashes for {len(blocks)} blocks")
        blobs = [Blob.of(b) for b in blocks]
        stored = existed = 0
        for start, end in batches([b.nbytes for b in blobs], self.max_batch_bytes):
            peer = self._usable()
            if peer is None:
                self.stats.put_errors += 1
                break
            msg = PutBlocks(list(hashes[start:end]), blobs[start:end], traffic_class)
            try:
                reply: Stored = await peer.ask(msg, timeout=self.timeout_s)
            except DsiError as exc:
                self.stats.put_errors += 1
                self._failed(peer, "put", exc)
                break
            self.stats.puts += 1
            self.stats.put_blocks += end - start
            stored, existed = stored + reply.stored, existed + reply.existed
        return Stored(stored, existed)

    async def find_state(self, block_hash: bytes) -> str:
        """The engine instance that announced the SWA state at this block, or "" (also on failure)."""
        peer = self._usable()
        if peer is None:
            return ""
        try:
            found: StateLocation = await peer.ask(FindState(block_hash), timeout=self.match_timeout_s)
        except DsiError as exc:
            self._failed(peer, "find_state", exc)
            return ""
        return found.owner

    def announce_states(self, owner: str, block_hashes: Sequence[bytes]) -> bool:
        """Tell the kvstore that ``owner`` holds these SWA states: queued behind the puts queued
        before it (so a state is announced after the blocks up to it are sent), and waiting like
        them while the kvstore is unknown or away. Never raises; False (``dropped`` counted) when
        the queue is full."""
        if not block_hashes:
            return True
        if self._queued_blocks + len(block_hashes) > self.max_queued_blocks:
            self.stats.dropped += len(block_hashes)
            return False
        self._queue.append(_Queued(list(block_hashes), None, owner=owner))
        self._queued_blocks += len(block_hashes)
        self._idle.clear()
        self._wake.set()
        return True

    def put_background(
        self, hashes: Sequence[bytes], blocks: Sequence[Any], traffic_class: str = "chatbot"
    ) -> bool:
        """Queue a put and return at once; False (and ``dropped`` counted) when the queue is full.
        While the kvstore is unknown or away the queue waits for it (a restart loses nothing that
        fits in the queue); a put that fails once sent is dropped and counted.
        The blocks are sent as they are when their turn comes: do not modify them meanwhile."""
        if len(hashes) != len(blocks):
            raise ValueError(f"{len(hashes)} hashes for {len(blocks)} blocks")
        if self._queued_blocks + len(hashes) > self.max_queued_blocks:
            self.stats.dropped += len(hashes)
            return False
        self._queue.append(_Queued(list(hashes), list(blocks), traffic_class))
        self._queued_blocks += len(hashes)
        self._idle.clear()
        self._wake.set()
        return True

    async def flush(self, timeout: float = 10.0) -> None:
        """Until every queued put has been sent (or failed); TimeoutError after ``timeout`` s."""
        async with asyncio.timeout(timeout):
            await self._idle.wait()

    # ---- internals ---------------------------------------------------------------------------
    async def _write_forever(self) -> None:
        while True:
            await self._wake.wait()
            while self._queue:
                item = self._queue[0]
                peer = self._usable()
                if peer is None:  # kvstore unknown or away: keep the queue (bounded), retry
                    await asyncio.sleep(self.retry_s / 4)
                    continue
                try:
                    if item.blocks is None:
                        peer.tell(AnnounceStates(item.owner, item.hashes))
                        self.stats.announced += len(item.hashes)
                    else:
                        await self.put(item.hashes, item.blocks, item.traffic_class)
                except Exception as exc:  # a bad item must not stop the writer
                    self.stats.put_errors += 1
                    log.warning("kvstore client: background put failed: %r", exc)
                self._queue.popleft()
                self._queued_blocks -= len(item.hashes)
            self._wake.clear()
            self._idle.set()

    def _usable(self) -> Peer | None:
        """The kvstore peer, or None while it is unknown, disconnected or marked away (then a re-resolve)."""
        now = asyncio.get_running_loop().time()
        if self._peer is not None and now >= self._down_until and not self._peer.away:
            return self._peer
        self.stats.unavailable += 1
        if self._controller is not None and now - self._resolved_at >= self.retry_s:
            self._resolved_at = now
            self._spawn(self._resolve())
        return None

    def _failed(self, peer: Peer, what: str, exc: DsiError) -> None:
        if not isinstance(exc, _UNREACHABLE) or peer is not self._peer:  # not the kvstore in use now
            log.debug("kvstore client: %s failed: %s", what, exc)
            return
        loop = asyncio.get_running_loop()
        if loop.time() >= self._down_until:
            log.warning("kvstore client: %s failed (%s); misses for %.1fs", what, exc.code, self.retry_s)
        self._down_until = loop.time() + self.retry_s

    async def _resolve(self) -> None:
        """Ask the controller for the kvstore; switch to it when it moved."""
        assert self._controller is not None
        self._resolved_at = asyncio.get_running_loop().time()
        try:
            address = await find_kvstore(self._controller)
        except DsiError as exc:
            log.debug("kvstore client: controller not reachable: %s", exc)
            return
        if address is not None and address != self._address:
            await self._switch(address)

    async def _find_first(self) -> None:
        while self._peer is None:
            await asyncio.sleep(self.retry_s / 4)
            await self._resolve()

    async def _switch(self, address: str) -> None:
        old, self._peer = (
            self._peer,
            Peer(
                address, self._ctx, types=ALL, peer_id=self._peer_id, keys=self._keys, timeout=self.timeout_s
            ),
        )
        self._address = address
        self._down_until = 0.0
        self._spawn(self._peer.connect())  # a kvstore not up yet: the Peer says Hello when it is
        await asyncio.sleep(0)  # the frame pump starts with connect()
        if old is not None:
            await old.close()
        log.info("kvstore client: kvstore at %s", address)

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(_forget(self._tasks))


def _forget(tasks: set[asyncio.Task]) -> Callable[[asyncio.Task], None]:
    def done(task: asyncio.Task) -> None:
        tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("kvstore client: %r", task.exception())

    return done


def leading_run(read: BlocksRead, block_bytes: int) -> int:
    """Blocks before the first one not found (missing, corrupt) or not ``block_bytes`` long."""
    for i, (found, size) in enumerate(zip(read.found, read.sizes, strict=False)):
        if not found or size != block_bytes:
            return i
    return min(len(read.found), len(read.sizes))


def batches(
    sizes: Sequence[int], max_bytes: int, max_blocks: int = MAX_BATCH_BLOCKS
) -> list[tuple[int, int]]:
    """``[start, end)`` ranges of consecutive blocks, each within ``max_blocks`` and ``max_bytes``
    (a single larger block goes alone)."""
    out: list[tuple[int, int]] = []
    start, total = 0, 0
    for i, size in enumerate(sizes):
        if i > start and (i - start >= max_blocks or total + size > max_bytes):
            out.append((start, i))
            start, total = i, 0
        total += size
    if start < len(sizes):
        out.append((start, len(sizes)))
    return out
