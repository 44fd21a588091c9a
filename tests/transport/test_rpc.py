import asyncio

import numpy as np
import pytest
import torch
import zmq.asyncio

from dsi.errors import ActorStopped, AskTimeout, HandlerError, InvalidRequest, PeerLost
from dsi.messages.blob import Blob
from dsi.transport.client import Peer
from dsi.transport.server import ActorServer
from tests.transport.echo import ECHO_TYPES, Boom, Count, Echo, EchoActor, Note, Sleep


@pytest.fixture
async def pair():
    ctx = zmq.asyncio.Context()
    server = ActorServer(EchoActor(), "tcp://127.0.0.1:*", ctx, role="test")
    await server.start()
    peer = Peer(server.address, ctx, types=ECHO_TYPES, timeout=5.0)
    await peer.connect()
    yield server, peer
    await peer.close()
    await server.stop()
    ctx.term()


async def test_ask_reply_and_handshake(pair):
    _, peer = pair
    assert peer.welcome.peer_id == "echo" and peer.welcome.role == "test"
    assert await peer.ask(Echo("hi")) == Echo("hi")


async def test_stream_items_in_order(pair):
    _, peer = pair
    got = [item.i async for item in peer.stream(Count(50))]
    assert got == list(range(50))


async def test_tell_reaches_handler(pair):
    server, peer = pair
    peer.tell(Note("a"))
    peer.tell(Note("b"))
    for _ in range(100):
        if len(server.actor.notes) == 2:
            break
        await asyncio.sleep(0.01)
    assert server.actor.notes == ["a", "b"]


async def test_handler_exception_is_an_error_reply_and_role_survives(pair):
    _, peer = pair
    with pytest.raises(HandlerError, match="handler crashed"):
        await peer.ask(Boom())
    with pytest.raises(InvalidRequest, match="you asked for it"):
        await peer.ask(Boom("invalid"))
    assert await peer.ask(Echo("still here")) == Echo("still here")


async def test_ask_timeout_is_typed(pair):
    _, peer = pair
    with pytest.raises(AskTimeout):
        await peer.ask(Sleep(2.0), timeout=0.2)
    assert await peer.ask(Echo("after")) == Echo("after")


async def test_concurrent_handlers_overlap(pair):
    _, peer = pair
    loop = asyncio.get_running_loop()
    start = loop.time()
    replies = await asyncio.gather(*(peer.ask(Sleep(0.3)) for _ in range(10)))
    assert replies == [Note("slept")] * 10
    assert loop.time() - start < 2.0  # ten 0.3 s sleeps in parallel, not 3 s in a row


async def test_stop_answers_pending_calls(pair):
    server, peer = pair
    pending = asyncio.ensure_future(peer.ask(Sleep(5.0)))
    await asyncio.sleep(0.1)
    await server.actor.stop()
    with pytest.raises(ActorStopped):
        await asyncio.wait_for(pending, 2.0)


async def test_16mib_tensor_round_trip_without_copy(pair):
    _, peer = pair
    tensor = torch.arange(4 * 1024 * 1024, dtype=torch.float32)  # 16 MiB
    blob = Blob.of(tensor)
    assert blob.address() == tensor.data_ptr()  # the send side wraps, never copies
    reply = await peer.ask(Echo("t", blob))
    got = reply.data.torch()
    assert torch.equal(got, tensor)
    # The received tensor is a view of the ZeroMQ frame's own memory.
    frame = reply.data._owner
    assert got.data_ptr() == np.frombuffer(frame.buffer, np.uint8).ctypes.data


async def test_no_pickle_on_the_wire(pair, monkeypatch):
    import pickle

    def refuse(*_a, **_k):
        raise AssertionError("pickle used on the wire path")

    monkeypatch.setattr(pickle, "dumps", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "Pickler", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    _, peer = pair
    data = Blob.of(torch.ones(1024, dtype=torch.bfloat16))
    reply = await peer.ask(Echo("no pickle", data))
    assert torch.equal(reply.data.torch(), torch.ones(1024, dtype=torch.bfloat16))


async def test_closed_peer_fails_calls():
    ctx = zmq.asyncio.Context()
    peer = Peer("tcp://127.0.0.1:1", ctx, types=ECHO_TYPES, timeout=0.3)
    with pytest.raises(AskTimeout):
        await peer.connect()
    await peer.close()
    with pytest.raises(PeerLost):
        await peer.ask(Echo("x"))
    ctx.term()


async def test_first_hello_timing_out_is_repeated_when_the_server_appears():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    ctx = zmq.asyncio.Context()
    peer = Peer(address, ctx, types=ECHO_TYPES, timeout=0.3)
    with pytest.raises(AskTimeout):
        await peer.connect()
    server = ActorServer(EchoActor(), address, ctx, role="late")
    await server.start()
    for _ in range(100):
        if peer.welcome is not None:
            break
        await asyncio.sleep(0.05)
    assert peer.welcome is not None and peer.welcome.role == "late"
    assert await peer.ask(Echo("hi"), timeout=5) == Echo("hi")
    await peer.close()
    await server.stop()
    ctx.term()


async def test_a_cancelled_ask_cancels_the_concurrent_handler(pair):
    server, peer = pair
    pending = asyncio.ensure_future(peer.ask(Sleep(5.0)))
    for _ in range(200):
        if server.actor._tasks:
            break
        await asyncio.sleep(0.01)
    assert server.actor._tasks
    pending.cancel()
    for _ in range(200):  # the CANCEL frame stops the 5 s handler at once
        if not server.actor._tasks:
            break
        await asyncio.sleep(0.01)
    assert not server.actor._tasks
    assert await peer.ask(Echo("after")) == Echo("after")
