"""A mixed pair of protocol versions serves a request: the controller and the entrypoint's decode
pool at the current version N, a decode at N-1 played by the frozen version-3 schema
(tests/transport/protocol_v3.py) behind a version-3 transport, all over real sockets on
127.0.0.1. A peer two versions back gets a typed error and the controller keeps serving."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator

import msgspec
import pytest
import zmq
import zmq.asyncio

from dsi.actor import Actor, handles
from dsi.config import ClusterConfig
from dsi.engine.params import SamplingParams
from dsi.errors import ErrorInfo, VersionMismatch
from dsi.messages.control import Assignment, Heartbeat, InstanceTable, ListInstances
from dsi.messages.gateway import Abort, Generate, TokenChunk
from dsi.messages.version import PROTOCOL_VERSION, Protocol
from dsi.roles.controller import ControllerActor
from dsi.roles.entrypoint.backends import DecodePool
from dsi.transport.client import Peer
from dsi.transport.server import ActorServer
from dsi.transport.wire import Kind, pack_header
from tests.transport import protocol_v3 as v3

assert PROTOCOL_VERSION == 4, "move the frozen schema and VERSION_3 along with the version"
VERSION_2 = Protocol(version=2, oldest=2)  # two versions back from the current one
VERSION_1 = Protocol(version=1, oldest=1)  # two back from the old decode's


class OldDecode(Actor):
    """A decode of version 3: answers a Generate with its prompt reversed, in numbered chunks."""

    def __init__(self) -> None:
        super().__init__("decode-0")
        self.requests: list[Generate] = []
        self.aborted: list[str] = []

    @handles
    async def generate(self, msg: Generate) -> AsyncIterator[TokenChunk]:
        self.requests.append(msg)
        tokens = msg.token_ids[::-1]
        for i, token in enumerate(tokens):
            last = i == len(tokens) - 1
            yield TokenChunk(msg.request_id, [token], "stop" if last else "", len(msg.token_ids), seq=i + 1)

    @handles
    async def abort(self, msg: Abort) -> None:
        self.aborted.append(msg.request_id)


@pytest.fixture
async def cluster():
    ctx = zmq.asyncio.Context()
    config = ClusterConfig(controller="tcp://127.0.0.1:0", heartbeat_interval_s=0.5, heartbeat_timeout_s=5.0)
    controller = ControllerActor("controller-0", config)
    control = ActorServer(controller, "tcp://127.0.0.1:*", ctx, role="controller")
    old = OldDecode()
    decode = ActorServer(old, "tcp://127.0.0.1:*", ctx, role="decode", protocol=v3.VERSION_3)
    await control.start()
    await decode.start()
    try:
        yield ctx, control, decode, old
    finally:
        await decode.stop()
        await control.stop()
        ctx.destroy(linger=0)


async def test_an_old_decode_registers_and_serves_a_request_of_the_current_entrypoint(cluster):
    ctx, control, decode, old = cluster
    # The decode's heartbeat, in version 3, to the controller.
    beats = Peer(control.address, ctx, types=(Assignment,), peer_id="decode-0", protocol=v3.VERSION_3)
    welcome = await beats.connect(5.0)
    assert welcome.version == 3  # the controller comes down to the decode's version
    beat = Heartbeat("decode-0", "decode", "127.0.0.1", 42, decode.address, assigned="serving", protocol=3)
    assert await beats.ask(beat) == Assignment("serving")

    pool = DecodePool(control.address, ctx, refresh_s=0.1, item_timeout_s=10.0)
    await pool.start()
    try:
        for _ in range(100):  # the pool's Peer to the decode completes its handshake
            if pool.decode.ready:
                break
            await asyncio.sleep(0.05)
        assert pool.decode.ready == ["decode-0"]
        assert pool.decode._instances["decode-0"].peer.welcome.version == 3
        request = Generate("req-1", [11, 12, 13], SamplingParams(max_tokens=3), cached_tokens=0)
        chunks = [chunk async for chunk in pool.generate(request)]
    finally:
        await pool.close()
        await beats.close()
    assert [t for c in chunks for t in c.token_ids] == [13, 12, 11]
    assert chunks[-1].finish == "stop" and [c.seq for c in chunks] == [1, 2, 3]
    assert [r.request_id for r in old.requests] == ["req-1"]
    assert decode.errors_sent == 0 and control.errors_sent == 0

    status = Peer(control.address, ctx, types=(InstanceTable,), peer_id="dsi-status")
    await status.connect(5.0)
    try:
        table = await status.ask(ListInstances())
    finally:
        await status.close()
    assert [(i.instance_id, i.protocol) for i in table.instances] == [("decode-0", 3)]


async def test_a_peer_two_versions_back_gets_a_typed_error_and_the_controller_serves_on(cluster):
    ctx, control, _, _ = cluster
    ancient = Peer(
        control.address, ctx, types=(Assignment,), peer_id="decode-9", protocol=VERSION_2, timeout=5.0
    )
    try:
        with pytest.raises(VersionMismatch, match="version 2"):
            await ancient.connect()
    finally:
        await ancient.close()

    # A call of version 2 without a handshake: the error comes back in version 2, readable there.
    raw = ctx.socket(zmq.DEALER)
    raw.connect(control.address)
    try:
        await raw.send_multipart(
            [pack_header(Kind.ASK, 7, version=2), msgspec.msgpack.encode(ListInstances())]
        )
        header, body = await asyncio.wait_for(raw.recv_multipart(), 5.0)
    finally:
        raw.close(linger=0)
    _, version, kind, call_id = struct.unpack("!3sBBQ", header)
    assert (version, kind, call_id) == (2, Kind.ERROR, 7)
    assert msgspec.msgpack.decode(body, type=ErrorInfo).code == "version_mismatch"

    current = Peer(control.address, ctx, types=(InstanceTable,), peer_id="dsi-status")
    try:
        assert (await current.connect(5.0)).version == PROTOCOL_VERSION
        assert (await current.ask(ListInstances())).instances == []
    finally:
        await current.close()


async def test_a_current_caller_of_an_old_server_speaks_its_version_and_an_older_one_is_refused(cluster):
    ctx, _, decode, old = cluster
    newer = Peer(decode.address, ctx, types=(Assignment,), peer_id="controller-0")
    newer.tell(Abort("early"))  # made before the handshake: it waits for it, then goes in version 3
    try:
        assert (await newer.connect(5.0)).version == 3
        for _ in range(100):
            if old.aborted:
                break
            await asyncio.sleep(0.02)
    finally:
        await newer.close()
    assert old.aborted == ["early"] and decode.errors_sent == 0
    ancient = Peer(decode.address, ctx, peer_id="x", protocol=VERSION_1, timeout=5.0)
    try:
        with pytest.raises(VersionMismatch):
            await ancient.connect()
    finally:
        await ancient.close()
