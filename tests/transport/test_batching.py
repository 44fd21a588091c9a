"""Messages to one peer within one loop turn travel as one BATCH message, and come apart again."""

from __future__ import annotations

import msgspec
import pytest
import zmq
import zmq.asyncio

from dsi.errors import ErrorInfo
from dsi.messages.base import COMMON
from dsi.transport.server import ActorServer
from dsi.transport.wire import HEADER_SIZE, Codec, Kind, pack_header, unpack_header
from tests.transport.echo import ECHO_TYPES, Count, Echo, EchoActor, Number

CODEC = Codec([*ECHO_TYPES, *COMMON])


@pytest.fixture
async def server():
    ctx = zmq.asyncio.Context()
    srv = ActorServer(EchoActor(), "tcp://127.0.0.1:*", ctx, role="test")
    await srv.start()
    yield srv
    await srv.stop()
    ctx.term()


@pytest.fixture
def dealer(server):
    """A raw DEALER socket on the server: sees ZeroMQ messages as they are on the wire."""
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(server.address)
    yield sock
    sock.close(0)
    ctx.term()


def split(message: list[bytes]) -> list[tuple[Kind, int, bytes]]:
    """(kind, call id, body) of each message a wire message carries."""
    kind, count = unpack_header(message[0])
    if kind is not Kind.BATCH:
        return [(kind, count, message[1])]
    assert len(message) == 1 + 2 * count
    return [(*unpack_header(message[i]), message[i + 1]) for i in range(1, len(message), 2)]


async def test_a_stream_produced_in_one_turn_leaves_in_one_batch(dealer):
    await dealer.send_multipart([pack_header(Kind.STREAM, 7), *CODEC.encode(Count(16))])
    received: list[list[bytes]] = []
    items: list[tuple[Kind, int, bytes]] = []
    while not items or items[-1][0] is not Kind.END:
        received.append(await dealer.recv_multipart())
        items += split(received[-1])
    assert [CODEC.decode([body]) for kind, _, body in items[:-1]] == [Number(i) for i in range(16)]
    assert {call_id for _, call_id, _ in items} == {7}
    assert len(received) < len(items)  # 17 messages, fewer wire messages
    assert unpack_header(received[0][0])[0] is Kind.BATCH


async def test_a_batch_of_asks_is_answered_like_separate_asks(dealer):
    batch = [pack_header(Kind.BATCH, 3)]
    for call_id, text in ((1, "a"), (2, "b"), (3, "c")):
        batch += [pack_header(Kind.ASK, call_id), *CODEC.encode(Echo(text))]
    await dealer.send_multipart(batch)
    replies: dict[int, object] = {}
    while len(replies) < 3:
        for kind, call_id, body in split(await dealer.recv_multipart()):
            assert kind is Kind.REPLY
            replies[call_id] = CODEC.decode([body])
    assert replies == {1: Echo("a"), 2: Echo("b"), 3: Echo("c")}


@pytest.mark.parametrize(
    "frames",
    [
        [pack_header(Kind.BATCH, 3), pack_header(Kind.ASK, 1), CODEC.encode(Echo("a"))[0]],  # says 3, holds 1
        [pack_header(Kind.BATCH, 1), pack_header(Kind.ASK, 1), CODEC.encode(Echo("a"))[0]],  # a batch of 1
        [pack_header(Kind.BATCH, 2), pack_header(Kind.ASK, 1), b"x", pack_header(Kind.ASK, 2)],  # odd
    ],
    ids=["count", "one", "odd"],
)
async def test_a_malformed_batch_gets_an_error_and_the_server_keeps_serving(dealer, frames):
    await dealer.send_multipart(frames)
    reply = await dealer.recv_multipart()
    kind, call_id = unpack_header(reply[0])
    assert (kind, call_id) == (Kind.ERROR, unpack_header(frames[0])[1])
    info = msgspec.msgpack.decode(reply[1], type=ErrorInfo)
    assert info.code == "bad_message" and "BATCH" in info.message
    await dealer.send_multipart([pack_header(Kind.ASK, 9), *CODEC.encode(Echo("still"))])
    [(kind, call_id, body)] = split(await dealer.recv_multipart())
    assert (kind, call_id, CODEC.decode([body])) == (Kind.REPLY, 9, Echo("still"))
    assert len(reply[0]) == HEADER_SIZE
