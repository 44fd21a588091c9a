"""CURVE: an authorised caller gets replies; a caller without the right keys gets nothing at all."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import zmq
import zmq.asyncio
import zmq.auth

from dsi.errors import AskTimeout
from dsi.transport.client import Peer
from dsi.transport.security import Authenticator, CurveKeys, generate_keys
from dsi.transport.server import ActorServer
from tests.transport.echo import ECHO_TYPES, Count, Echo, EchoActor
from tests.transport.procs import EchoServers, free_address

REFUSED_TIMEOUT_S = 0.5  # how long a refused caller waits for the reply that must never come


@pytest.fixture
def key_files(tmp_path: Path) -> dict[str, Path]:
    return generate_keys(tmp_path / "keys")


@pytest.fixture
def client_keys(key_files: dict[str, Path]) -> CurveKeys:
    return CurveKeys.load(key_files["server_public"], key_files["client_secret"])


@pytest.fixture
async def server(key_files: dict[str, Path]) -> AsyncIterator[ActorServer]:
    keys = CurveKeys.load(
        key_files["server_public"],
        key_files["client_secret"],
        server_secret_key=key_files["server_secret"],
        authorized_keys_dir=key_files["authorized_dir"],
    )
    ctx = zmq.asyncio.Context()
    auth = Authenticator(ctx, keys)  # before bind: the ZAP handler must be there for the first caller
    server = ActorServer(EchoActor(), "tcp://127.0.0.1:*", ctx, role="secure", keys=keys)
    await server.start()
    yield server
    await server.stop()
    auth.stop()
    ctx.term()


@pytest.fixture
def client_ctx() -> Iterator[zmq.asyncio.Context]:
    ctx = zmq.asyncio.Context()
    yield ctx
    ctx.term()


async def test_authorised_peer_gets_replies(server, client_ctx, client_keys):
    peer = Peer(server.address, client_ctx, types=ECHO_TYPES, keys=client_keys, timeout=10.0)
    try:
        welcome = await peer.connect()
        assert (welcome.peer_id, welcome.role) == ("echo", "secure")
        assert await peer.ask(Echo("over curve")) == Echo("over curve")
        assert [n.i async for n in peer.stream(Count(5))] == list(range(5))
    finally:
        await peer.close()
    assert server.actor.handled == 2


def _intruder_keys(tmp_path: Path, server_public: Path) -> CurveKeys:
    """A valid keypair whose public key is not in the authorised directory."""
    directory = tmp_path / "intruder"
    directory.mkdir()
    _, secret = zmq.auth.create_certificates(directory, "intruder")
    return CurveKeys.load(server_public, Path(secret))


@pytest.mark.parametrize("who", ["no keys", "unauthorised keypair"])
async def test_refused_peer_gets_no_reply_at_all(who, server, client_ctx, client_keys, key_files, tmp_path):
    keys = None if who == "no keys" else _intruder_keys(tmp_path, key_files["server_public"])
    intruder = Peer(server.address, client_ctx, types=ECHO_TYPES, keys=keys, timeout=REFUSED_TIMEOUT_S)
    try:
        with pytest.raises(AskTimeout):
            await intruder.connect()
        with pytest.raises(AskTimeout):
            await intruder.ask(Echo("let me in"))
        assert intruder.welcome is None
    finally:
        await intruder.close()
    assert server.actor.handled == 0
    assert server.errors_sent == 0  # not even an ERROR frame went back
    # The refused caller did not disturb the role: an authorised one is still served.
    peer = Peer(server.address, client_ctx, types=ECHO_TYPES, keys=client_keys, timeout=10.0)
    try:
        await peer.connect()
        assert await peer.ask(Echo("me")) == Echo("me")
    finally:
        await peer.close()


@pytest.mark.slow
@pytest.mark.concurrent
async def test_echo_server_process_with_curve_dir(tmp_path, key_files, client_keys, client_ctx):
    with EchoServers(tmp_path) as servers:
        proc = servers.start(free_address(), curve_dir=key_files["server_public"].parent)
        peer = Peer(proc.address, client_ctx, types=ECHO_TYPES, keys=client_keys, timeout=10.0)
        outsider = Peer(proc.address, client_ctx, types=ECHO_TYPES, timeout=REFUSED_TIMEOUT_S)
        try:
            await peer.connect()
            assert await peer.ask(Echo("process")) == Echo("process")
            with pytest.raises(AskTimeout):
                await outsider.connect()
        finally:
            await peer.close()
            await outsider.close()
        assert proc.terminate() == 0
