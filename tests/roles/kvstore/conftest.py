"""A KvstoreActor served on 127.0.0.1 in this process, and helpers to talk to it."""

from __future__ import annotations

import asyncio
import errno
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import zmq.asyncio

from dsi.config import KvstoreOptions
from dsi.kvcache.hashchain import HashChain, unpack
from dsi.messages import ALL
from dsi.messages.blob import Blob
from dsi.messages.kvstore import PutBlocks
from dsi.roles.kvstore import KvstoreActor
from dsi.transport.client import Peer
from dsi.transport.server import ActorServer


class Clock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@dataclass
class Running:
    actor: KvstoreActor
    server: ActorServer
    peer: Peer

    @property
    def address(self) -> str:
        return self.server.address


class Kvstores:
    """Starts kvstores (one at a time or several) and stops whatever is still running."""

    def __init__(self, ctx: zmq.asyncio.Context, store_dir: Path, clock: Clock) -> None:
        self.ctx = ctx
        self.store_dir = store_dir
        self.clock = clock
        self.running: list[Running] = []

    async def start(self, address: str = "tcp://127.0.0.1:*", **options) -> Running:
        opts = KvstoreOptions(store_dir=self.store_dir, **{"segment_bytes": 1 << 20, **options})
        actor = KvstoreActor("kvstore-t", opts, clock=self.clock)
        server = await self._bind(actor, address)
        await server.start()
        peer = Peer(server.address, self.ctx, types=ALL, timeout=10)
        await peer.connect()
        run = Running(actor, server, peer)
        self.running.append(run)
        return run

    async def _bind(self, actor: KvstoreActor, address: str) -> ActorServer:
        """ZeroMQ releases a closed socket's port in the background: retry a restart's bind."""
        for _ in range(100):
            try:
                return ActorServer(actor, address, self.ctx, role="kvstore")
            except zmq.ZMQError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
                await asyncio.sleep(0.05)
        raise TimeoutError(f"{address} stayed in use")

    async def stop(self, run: Running) -> None:
        self.running.remove(run)
        await run.peer.close()
        await run.server.stop()

    async def stop_all(self) -> None:
        for run in reversed(list(self.running)):
            await self.stop(run)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def kvstores(tmp_path, clock):
    ctx = zmq.asyncio.Context()
    group = Kvstores(ctx, tmp_path / "store", clock)
    yield group
    await group.stop_all()
    ctx.destroy(linger=0)


def chain(n_blocks: int, seed: int = 0) -> bytes:
    ids = np.random.default_rng(seed).integers(0, 129_280, size=128 * n_blocks, dtype=np.uint32)
    return HashChain(root_seed=11, block_size=128).hashes(ids)


def block_bytes(n: int, size: int = 2048, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed + 7)
    return [rng.integers(0, 256, size=size, dtype=np.uint8).tobytes() for _ in range(n)]


def put_msg(packed: bytes, data: list[bytes], traffic_class: str = "chatbot") -> PutBlocks:
    return PutBlocks(unpack(packed), [Blob(d) for d in data], traffic_class)
