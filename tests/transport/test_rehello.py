"""A process that comes back at the same address but answers late: the Peer asks its Hello again
until it is answered, so the connection does not stay ``away`` for good (a vLLM role binds its
socket long before it has loaded)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import zmq.asyncio

from dsi.errors import AskTimeout
from dsi.transport.client import Peer
from dsi.transport.server import ActorServer
from tests.transport.echo import ECHO_TYPES, Echo, EchoActor
from tests.transport.procs import free_address

TIMEOUT_S = 0.5  # the Peer's Hello timeout
BUSY_S = 2.0  # how long the restarted server's loop answers nothing


class ThreadServer:
    """An echo ActorServer on an event loop of its own thread, so that loop can be kept busy."""

    def __init__(self, address: str, busy_s: float = 0.0) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.ctx = zmq.asyncio.Context()
        self.server: ActorServer | None = None
        asyncio.run_coroutine_threadsafe(self._start(address, busy_s), self.loop).result(10)

    async def _start(self, address: str, busy_s: float) -> None:
        self.server = ActorServer(EchoActor(), address, self.ctx, role="echo")
        await self.server.start()
        if busy_s:
            self.loop.call_soon(time.sleep, busy_s)  # bound, but nothing is answered meanwhile

    def stop(self) -> None:
        assert self.server is not None
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.ctx.term()
        self.loop.close()


async def _until(condition, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def test_a_hello_unanswered_after_a_restart_is_asked_again_until_answered():
    address = free_address()
    ctx = zmq.asyncio.Context()
    first = ThreadServer(address)
    peer = Peer(address, ctx, types=ECHO_TYPES, timeout=TIMEOUT_S)
    second = None
    try:
        await peer.connect()
        first.stop()
        assert await _until(lambda: not peer.connected, 10.0)
        assert peer.away
        # returns once the new server's loop is free again: the Peer's first Hellos timed out
        second = await asyncio.to_thread(ThreadServer, address, BUSY_S)
        assert await _until(lambda: peer.connected, 10.0), "the peer stayed away"
        assert not peer.away
        assert await peer.ask(Echo("back")) == Echo("back")
    finally:
        await peer.close()
        if second is not None:
            second.stop()
        ctx.term()


async def test_a_first_hello_that_times_out_on_a_live_connection_is_asked_again():
    """The connection comes up while the first Hello waits in the socket, and the server's loop
    is too busy to answer it in time: ``connect`` times out, and the Peer keeps asking on its own
    (a role's heartbeats, held until the first handshake, would otherwise never be sent)."""
    address = free_address()
    ctx = zmq.asyncio.Context()
    peer = Peer(address, ctx, types=ECHO_TYPES, timeout=TIMEOUT_S)
    starting = asyncio.ensure_future(asyncio.to_thread(ThreadServer, address, BUSY_S))
    server = None
    try:
        with pytest.raises(AskTimeout):
            await peer.connect()
        held = asyncio.ensure_future(peer.ask(Echo("held"), timeout=10.0))  # waits for the handshake
        server = await starting
        assert await _until(lambda: peer.connected, 10.0), "the first Hello was never asked again"
        assert await held == Echo("held")
    finally:
        await peer.close()
        if server is None:
            server = await starting
        server.stop()
        ctx.term()
