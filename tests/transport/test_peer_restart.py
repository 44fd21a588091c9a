"""A role process dies and comes back: pending callers learn at once, the same Peer reconnects."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import zmq.asyncio

from dsi.errors import ActorStopped, AskTimeout, PeerLost
from dsi.transport.client import Peer
from tests.transport.echo import ECHO_TYPES, Count, Echo, Note, Notes, Sleep
from tests.transport.procs import EchoServers, free_address

pytestmark = pytest.mark.slow

ASK_TIMEOUT_S = 20.0
LOST_WITHIN_S = 5.0  # far below the ask timeout: a dead peer is noticed, not waited out
RECONNECT_WITHIN_S = 30.0  # restart of a python process on a loaded machine + reconnect backoff
PENDING_ASKS = 5


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[EchoServers]:
    with EchoServers(tmp_path) as group:
        yield group


@pytest.fixture
def ctx() -> Iterator[zmq.asyncio.Context]:
    ctx = zmq.asyncio.Context()
    yield ctx
    ctx.term()


async def _drain(stream: AsyncIterator[object]) -> int:
    """Consume a stream until it ends or raises; the number of items it still gave."""
    count = 0
    async for _ in stream:
        count += 1
    return count


async def test_sigkill_fails_pending_calls_and_the_same_peer_reconnects(servers, ctx):
    address = free_address()
    proc = servers.start(address)
    peer = Peer(address, ctx, types=ECHO_TYPES, timeout=ASK_TIMEOUT_S)
    loop = asyncio.get_running_loop()
    try:
        first_welcome = await peer.connect()
        asks = [asyncio.ensure_future(peer.ask(Sleep(30.0))) for _ in range(PENDING_ASKS)]
        stream = peer.stream(Count(1_000_000, delay_s=0.01))
        # Frames on one connection arrive in order: once the stream's first item is back, the
        # server holds every ask too.
        assert (await anext(stream)).i == 0
        assert peer.pending == PENDING_ASKS + 1

        killed_at = loop.time()
        proc.kill()
        results = await asyncio.gather(*asks, return_exceptions=True)
        with pytest.raises(PeerLost):
            await _drain(stream)
        lost_after = loop.time() - killed_at
        assert all(isinstance(r, PeerLost) for r in results), results
        assert lost_after < LOST_WITHIN_S
        assert peer.pending == 0

        # A call made while the role is down waits for the new process.
        queued = asyncio.ensure_future(peer.ask(Echo("queued"), timeout=RECONNECT_WITHIN_S))
        await asyncio.to_thread(servers.start, address)  # same address, fresh process
        asked_at = loop.time()
        assert await peer.ask(Echo("back"), timeout=RECONNECT_WITHIN_S) == Echo("back")
        assert await queued == Echo("queued")
        assert loop.time() - asked_at < RECONNECT_WITHIN_S
        # The Peer repeated the Hello handshake on the new connection by itself.
        while peer.welcome is first_welcome and loop.time() - asked_at < RECONNECT_WITHIN_S:
            await asyncio.sleep(0.05)
        assert peer.welcome is not first_welcome and peer.welcome == first_welcome
        assert [n.i async for n in peer.stream(Count(3))] == [0, 1, 2]
    finally:
        await peer.close()


async def test_sigterm_answers_pending_callers_and_exits_cleanly(servers, ctx):
    proc = servers.start(free_address())
    peer = Peer(proc.address, ctx, types=ECHO_TYPES, timeout=ASK_TIMEOUT_S)
    try:
        await peer.connect()
        pending = asyncio.ensure_future(peer.ask(Sleep(30.0)))
        assert await peer.ask(Echo("in order")) == Echo("in order")  # the Sleep is on the server
        code = await asyncio.to_thread(proc.terminate)
        assert code == 0
        # The role answers its callers before it goes; the caller may still see the
        # disconnect first, and then reports the peer as lost - either way, never a hang.
        with pytest.raises((ActorStopped, PeerLost)):
            await asyncio.wait_for(pending, LOST_WITHIN_S)
    finally:
        await peer.close()


async def test_calls_given_up_while_the_peer_was_away_never_reach_the_process_that_comes_back(servers, ctx):
    """A stopped role's connection drops (ZMTP heartbeats); what its callers gave up on meanwhile
    (a timeout, a closed stream, fail_pending) must not run in the process that serves the
    address next: a restarted role would run work that was already re-run elsewhere."""
    address = free_address()
    first = servers.start(address)
    peer = Peer(address, ctx, types=ECHO_TYPES, timeout=ASK_TIMEOUT_S)
    loop = asyncio.get_running_loop()
    try:
        await peer.connect()
        os.kill(first.pid, signal.SIGSTOP)  # alive, silent: the heartbeat timeout drops it
        stopped_at = loop.time()
        while not peer.away:
            assert loop.time() - stopped_at < LOST_WITHIN_S + 5.0, "the connection never dropped"
            await asyncio.sleep(0.05)
        with pytest.raises(AskTimeout):
            await peer.ask(Note("timed out"), timeout=0.3)
        stream = peer.stream(Note("stream closed"), timeout=0.3)
        with pytest.raises(AskTimeout):
            await anext(stream)
        await stream.aclose()
        failed = asyncio.ensure_future(peer.ask(Note("failed by the caller"), timeout=ASK_TIMEOUT_S))
        await asyncio.sleep(0.1)
        peer.fail_pending(PeerLost("declared dead"))
        with pytest.raises(PeerLost):
            await failed
        kept = asyncio.ensure_future(peer.ask(Note("still waited for"), timeout=RECONNECT_WITHIN_S))
        await asyncio.to_thread(first.kill)
        await asyncio.to_thread(servers.start, address)  # same address, fresh process
        await kept
        assert (await peer.ask(Notes(), timeout=RECONNECT_WITHIN_S)).text == "still waited for"
    finally:
        await peer.close()
