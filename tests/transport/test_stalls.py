"""A server whose caller stops reading a stream: the stream waits for it and loses nothing; a
caller that reads nothing for the stall limit has the held messages dropped, counted and logged;
one that is gone has them counted. The caller is a raw DEALER whose reads the test controls."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
import zmq
import zmq.asyncio

from dsi.actor import Actor, handles
from dsi.messages.base import Message
from dsi.transport import sockets
from dsi.transport.server import ActorServer
from dsi.transport.wire import Codec, Kind, pack_header, unpack_header

ITEMS, SIZE = 400, 64 * 1024  # 25 MiB: far more than the loopback buffers hold


class Flood(Message):
    n: int
    size: int


class Payload(Message):
    i: int
    data: bytes


class FloodActor(Actor):
    def __init__(self) -> None:
        super().__init__("flood")
        self.sent = 0  # items handed to the server so far

    @handles
    async def flood(self, msg: Flood) -> AsyncIterator[Payload]:
        for i in range(msg.n):
            self.sent = i + 1
            yield Payload(i, bytes(msg.size))
            await asyncio.sleep(0)  # one item per turn: one message each, not one BATCH


@pytest.fixture
async def flooded(monkeypatch):
    """(server, actor, caller socket, codec): a Flood stream asked, nothing read yet."""
    monkeypatch.setattr(sockets, "HWM", 2)  # tune() reads it: tiny socket queues on both sides
    ctx = zmq.asyncio.Context()
    actor = FloodActor()
    server = ActorServer(actor, "tcp://127.0.0.1:*", ctx, role="flood")
    await server.start()
    caller = ctx.socket(zmq.DEALER)
    caller.setsockopt(zmq.RCVHWM, 1)
    caller.setsockopt(zmq.RCVBUF, 64 * 1024)
    caller.setsockopt(zmq.LINGER, 0)
    caller.connect(server.address)
    codec = Codec([Payload, Flood])
    await caller.send_multipart([pack_header(Kind.STREAM, 7), *codec.encode(Flood(ITEMS, SIZE))])
    yield server, actor, caller, codec
    caller.close(linger=0)
    await server.stop()
    ctx.destroy(linger=0)


async def until(check, timeout_s: float = 5.0) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("timed out")


async def test_a_stream_waits_for_a_reader_that_stops_and_loses_nothing(flooded):
    server, actor, caller, codec = flooded
    stalls = server._stalls
    await until(lambda: stalls.stalls > 0)  # the caller's queue and the buffers are full
    await asyncio.sleep(0.3)
    paused_at = actor.sent
    await asyncio.sleep(0.3)
    assert actor.sent == paused_at < ITEMS  # the producer waits for its reader
    got = []
    while True:
        frames = await asyncio.wait_for(caller.recv_multipart(), 5.0)
        kind, call_id = unpack_header(frames[0])
        if kind is Kind.END:
            break
        if kind is Kind.BATCH:  # several items in one message: header, body pairs
            got += [codec.decode([b]).i for b in frames[2::2]]
        else:
            assert kind is Kind.ITEM and call_id == 7
            got.append(codec.decode(frames[1:]).i)
    assert got == list(range(ITEMS))
    assert server.dropped == {}


async def test_a_reader_silent_past_the_stall_limit_has_its_messages_dropped_counted_and_logged(
    flooded, caplog
):
    server, actor, _, _ = flooded
    server._stalls.limit_s = 0.2
    with caplog.at_level(logging.WARNING, logger="dsi.transport.stalls"):
        await until(lambda: server.dropped.get("full", 0) > 0)
    assert "read nothing for 0.2s" in caplog.text
    before = actor.sent
    await until(lambda: actor.sent > before)  # the producer was not held up for good


async def test_messages_to_a_caller_that_is_gone_are_counted(flooded):
    server, _, caller, _ = flooded
    await until(lambda: server._stalls.stalls > 0)
    caller.close(linger=0)
    await until(lambda: server.dropped.get("gone", 0) > 0)
    assert server._stalls.waiting == 0
