"""Malformed frames against a live ActorServer: every one gets an ERROR frame, the role survives.

The server runs EchoActor on its own event loop in a background thread; the test drives a plain
synchronous DEALER socket so that hypothesis can generate and send thousands of messages fast.
Each generated ``Case`` says which error code and call id the answer must carry.
"""

from __future__ import annotations

import asyncio
import struct
import threading
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from msgspec.msgpack import Ext

from dsi.errors import ErrorInfo
from dsi.messages.base import COMMON, PROTOCOL_VERSION, Ack, Hello, Ping, Pong, Welcome
from dsi.messages.version import CURRENT
from dsi.transport.client import Peer
from dsi.transport.server import ActorServer
from dsi.transport.wire import Codec, Kind
from tests.transport.echo import ECHO_TYPES, Echo, EchoActor, Note, Number

MIN_MESSAGES = 2000
REPLY_TIMEOUT_MS = 10_000  # generous: the machine is shared; a healthy server answers in < 1 ms

BAD = "bad_message"
_HEADER = struct.Struct("!3sBBQ")
_KNOWN_KINDS = {int(kind) for kind in Kind}
_CALL_KINDS = [kind for kind in Kind if kind is not Kind.CANCEL]  # a CANCEL is never answered
_REPLY_KINDS = [Kind.REPLY, Kind.ERROR, Kind.ITEM, Kind.END, Kind.PUBLISH]
_TAGS = [tp.__name__ for tp in (*ECHO_TYPES, *COMMON)]
_ITEMSIZE = {"uint8": 1, "int8": 1, "float16": 2, "bfloat16": 2, "int32": 4, "float32": 4, "int64": 8}


@dataclass(frozen=True, slots=True)
class Case:
    """One malformed multipart message and the ERROR it must be answered with."""

    what: str
    frames: list[bytes]
    code: str
    call_id: int


def _header(kind: int, call_id: int, version: int = PROTOCOL_VERSION, magic: bytes = b"DSI") -> bytes:
    return _HEADER.pack(magic, version, kind, call_id)


def _peek(header: bytes) -> int:
    return _HEADER.unpack(header)[3] if len(header) == _HEADER.size else 0


def _encode(value: Any) -> bytes:
    return msgspec.msgpack.encode(value)


# ---- strategies --------------------------------------------------------------------------------
call_ids = st.integers(0, 2**64 - 1)
small_bytes = st.binary(max_size=48)
blob_frames = st.lists(st.binary(max_size=32), max_size=3)
msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
valid_bodies = st.sampled_from([Echo("hi"), Note("n"), Ack(), Hello(PROTOCOL_VERSION, "fuzz")]).map(_encode)


@st.composite
def random_frames(draw: st.DrawFn) -> Case:
    frames = draw(
        st.lists(small_bytes | st.binary(min_size=13, max_size=13), min_size=1, max_size=4).filter(
            lambda fs: not fs[0].startswith(b"DSI")
        )
    )
    return Case("random bytes in every frame", frames, BAD, _peek(frames[0]))


@st.composite
def header_with_garbage_body(draw: st.DrawFn, decodable: Any) -> Case:
    kind, call_id = draw(st.sampled_from(_CALL_KINDS)), draw(call_ids)
    body = draw(small_bytes.filter(lambda b: not decodable(b)))
    return Case(
        f"valid {kind.name} header + random body",
        [_header(kind, call_id), body, *draw(blob_frames)],
        BAD,
        call_id,
    )


@st.composite
def wrong_magic(draw: st.DrawFn) -> Case:
    magic = draw(st.binary(min_size=3, max_size=3).filter(lambda m: m != b"DSI"))
    kind, version, call_id = draw(st.integers(0, 255)), draw(st.integers(0, 255)), draw(call_ids)
    return Case("wrong magic", [_header(kind, call_id, version, magic), draw(valid_bodies)], BAD, call_id)


@st.composite
def wrong_version(draw: st.DrawFn) -> Case:
    version = draw(st.integers(0, 255).filter(lambda v: not CURRENT.accepts(v)))
    # A Hello of any version is answered (dsi.messages.version): not a wrong version.
    kind, call_id = draw(st.integers(0, 255).filter(lambda k: k != Kind.HELLO)), draw(call_ids)
    body = draw(valid_bodies | small_bytes)
    return Case("wrong version", [_header(kind, call_id, version), body], "version_mismatch", call_id)


@st.composite
def unknown_kind(draw: st.DrawFn) -> Case:
    kind = draw(st.integers(0, 255).filter(lambda k: k not in _KNOWN_KINDS))
    call_id = draw(call_ids)
    return Case("unknown kind", [_header(kind, call_id), draw(valid_bodies)], BAD, call_id)


@st.composite
def bad_header_length(draw: st.DrawFn) -> Case:
    header = _header(draw(st.sampled_from(_CALL_KINDS)), draw(call_ids))
    cut = draw(st.integers(0, _HEADER.size - 1))
    frame = draw(st.sampled_from([header[:cut], header + draw(st.binary(min_size=1, max_size=8))]))
    return Case("truncated or overlong header", [frame, draw(valid_bodies)], BAD, 0)


@st.composite
def wrong_structure(draw: st.DrawFn, decodable: Any) -> Case:
    """msgpack that decodes but is no message: unknown tags, wrong field types, wrong arity."""
    tag = draw(st.sampled_from(_TAGS) | st.text(max_size=10))
    value = draw(
        st.builds(lambda fields: [tag, *fields], st.lists(msgpack_values, max_size=5)) | msgpack_values
    )
    body = _encode(value)
    kind, call_id = draw(st.sampled_from([Kind.ASK, Kind.TELL, Kind.STREAM, Kind.HELLO])), draw(call_ids)
    assume(not decodable(body))
    return Case("msgpack of the wrong shape", [_header(kind, call_id), body], BAD, call_id)


@st.composite
def bad_blob(draw: st.DrawFn) -> Case:
    """Echo whose Blob extension is broken: missing frame, bad code, garbage, wrong size or shape."""
    frames = draw(blob_frames)
    dtype = draw(st.sampled_from(sorted(_ITEMSIZE)))
    flaw = draw(st.sampled_from(["missing frame", "ext code", "garbage", "size", "negative dim", "overflow"]))
    index, shape, code = draw(st.integers(0, 3)), (draw(st.integers(0, 64)),), 1
    if flaw == "missing frame":
        index = draw(st.integers(len(frames), 2**32) | st.integers(-(2**31), -1))
    elif flaw == "size":
        frames = frames or [b"x"]
        index = draw(st.integers(0, len(frames) - 1))
        shape = draw(
            st.lists(st.integers(0, 2**20), min_size=1, max_size=3)
            .map(tuple)
            .filter(lambda s: _ITEMSIZE[dtype] * _prod(s) != len(frames[index]))
        )
    elif flaw == "negative dim":
        frames = frames or [b""]
        index = 0
        shape = (draw(st.integers(-(2**32), -1)), *draw(st.lists(st.integers(-64, 64), max_size=2)))
    elif flaw == "overflow":  # 2**64 elements: wraps to 0 in int64 arithmetic and "fits" 0 bytes
        frames, index, shape = [b""], 0, (2**32, 2**32)
    elif flaw == "ext code":
        code = draw(st.integers(-128, 127).filter(lambda c: c != 1))
    payload = _encode([index, dtype, list(shape)])
    if flaw == "garbage":
        payload = draw(small_bytes | msgpack_values.map(_encode))
        frames = []  # with no frames even a well-formed record refers to a missing one
    body = _encode(["Echo", "t", Ext(code, payload)])
    call_id = draw(call_ids)
    return Case(f"blob: {flaw}", [_header(Kind.ASK, call_id), body, *frames], BAD, call_id)


@st.composite
def reply_kind_as_call(draw: st.DrawFn) -> Case:
    kind, call_id = draw(st.sampled_from(_REPLY_KINDS)), draw(call_ids)
    body = draw(valid_bodies | st.just(_encode(ErrorInfo("internal", "x"))) | st.just(b""))
    return Case(f"{kind.name} sent as a call", [_header(kind, call_id), body], BAD, call_id)


@st.composite
def empty_parts(draw: st.DrawFn) -> Case:
    call_id = draw(call_ids)
    header = _header(draw(st.sampled_from([Kind.ASK, Kind.TELL, Kind.STREAM, Kind.HELLO])), call_id)
    frames, expected_id = draw(
        st.sampled_from(
            [
                ([b""], 0),
                ([b"", b""], 0),
                ([header], call_id),
                ([header, b""], call_id),
                ([header, b"", b""], call_id),
            ]
        )
    )
    return Case("empty parts", frames, BAD, expected_id)


@st.composite
def misrouted_message(draw: st.DrawFn) -> Case:
    """Well-formed messages sent the wrong way: runtime messages as tells, replies as calls."""
    call_id = draw(call_ids)
    kind, msg, code = draw(
        st.sampled_from(
            [
                (Kind.TELL, Hello(PROTOCOL_VERSION, "x"), BAD),
                (Kind.STREAM, Hello(PROTOCOL_VERSION, "x"), BAD),
                (Kind.TELL, Ping(1), BAD),
                (Kind.STREAM, Ping(1), BAD),
                (Kind.HELLO, Ping(1), BAD),
                (Kind.HELLO, Echo("x"), BAD),
                (Kind.TELL, Welcome(1, "x"), BAD),
                (Kind.TELL, Ack(), BAD),
                (Kind.ASK, Number(1), BAD),
                (Kind.TELL, Number(1), BAD),  # not a type this role accepts
                (Kind.ASK, Welcome(1, "x"), "unknown_message"),
                (Kind.ASK, Pong(), "unknown_message"),
                (Kind.ASK, Ack(), "unknown_message"),
                (Kind.STREAM, Ack(), "unknown_message"),
            ]
        )
    )
    return Case(f"{type(msg).__name__} as {kind.name}", [_header(kind, call_id), _encode(msg)], code, call_id)


def _prod(shape: tuple[int, ...]) -> int:
    out = 1
    for dim in shape:
        out *= dim
    return out


# ---- the live server -------------------------------------------------------------------------
class _ServerThread:
    """An ActorServer serving EchoActor on an event loop in a background thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="fuzz-server", daemon=True)
        self._thread.start()
        self.ctx = zmq.asyncio.Context()
        self.server: ActorServer = self.run(self._start())

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 60.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.run(self.server.stop())
        self.ctx.term()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
        self.loop.close()

    async def _start(self) -> ActorServer:
        server = ActorServer(EchoActor(), "tcp://127.0.0.1:*", self.ctx, role="fuzz")
        await server.start()
        return server


@pytest.fixture
def live() -> Iterator[_ServerThread]:
    server = _ServerThread()
    yield server
    server.close()


@pytest.fixture
def dealer(live: _ServerThread) -> Iterator[zmq.Socket]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, REPLY_TIMEOUT_MS)
    sock.connect(live.server.address)
    yield sock
    sock.close(0)
    ctx.term()


def _check_error_reply(sock: zmq.Socket, case: Case) -> None:
    try:
        reply = sock.recv_multipart()
    except zmq.Again:
        pytest.fail(f"{case.what}: no answer in {REPLY_TIMEOUT_MS} ms to {case.frames!r}")
    assert len(reply) == 2, f"{case.what}: answer has {len(reply)} frames"
    magic, version, kind, call_id = _HEADER.unpack(reply[0])
    # In the version of the frame answered, when it has a readable one: its sender reads that.
    sent = case.frames[0] if case.frames else b""
    readable = len(sent) == _HEADER.size and sent[:3] == b"DSI"
    expected_version = sent[3] if readable else PROTOCOL_VERSION
    assert (magic, version, kind) == (b"DSI", expected_version, Kind.ERROR), case.what
    assert call_id == case.call_id, case.what
    info = msgspec.msgpack.decode(reply[1], type=ErrorInfo)
    assert info.code == case.code, f"{case.what}: {info} for {case.frames!r}"
    assert not sock.poll(0), f"{case.what}: more than one answer"


def test_malformed_frames_get_error_frames_and_the_role_survives(
    live: _ServerThread, dealer: zmq.Socket
) -> None:
    codec = Codec([*live.server.actor.message_types, *COMMON])

    def decodable(body: bytes) -> bool:
        try:
            codec.decode([body])
        except Exception:
            return False
        return True

    cases = st.one_of(
        random_frames(),
        header_with_garbage_body(decodable),
        wrong_magic(),
        wrong_version(),
        unknown_kind(),
        bad_header_length(),
        wrong_structure(decodable),
        bad_blob(),
        reply_kind_as_call(),
        empty_parts(),
        misrouted_message(),
    )
    sent: dict[str, int] = {}

    @settings(max_examples=2400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(case=cases)
    def send_one(case: Case) -> None:
        dealer.send_multipart(case.frames)
        sent[case.what] = sent.get(case.what, 0) + 1
        _check_error_reply(dealer, case)

    send_one()
    assert sum(sent.values()) >= MIN_MESSAGES, sent
    assert not dealer.poll(200), "a stray frame arrived after the run"
    assert live.run(_still_serving(live)) == Echo("still here")


async def _still_serving(live: _ServerThread) -> Echo:
    server = live.server
    assert server.actor.running
    assert server.actor._loop_task is not None and not server.actor._loop_task.done()
    assert server.actor.handled == 0  # nothing malformed ever reached a handler
    peer = Peer(server.address, live.ctx, types=ECHO_TYPES, timeout=10.0)
    try:
        await peer.connect()
        return await peer.ask(Echo("still here"))
    finally:
        await peer.close()
