"""ActorServer: the I/O bridge between a ROUTER socket and one actor's inbox.

The bridge decodes frames at the boundary: a frame that is not a valid header + message of one
of the actor's types is answered with an ERROR frame (``bad_message``, ``version_mismatch``,
``unknown_message``) and never reaches a handler, so a bad peer cannot kill the role. Handlers
answer through a ``_RemoteChannel`` that writes REPLY / ITEM / END / ERROR frames back to the
caller's identity.

Nothing the server sends is dropped silently: what goes to a caller whose queue is full waits for
it (a stream's next item waits too, for up to ``STALL_LIMIT_S``), and what is dropped in the end,
or goes to a caller that is gone, is counted in ``dropped`` (by reason; see
dsi.transport.stalls) and a drop of a full queue is logged as a warning.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import zmq
import zmq.asyncio

from dsi.actor.actor import Actor
from dsi.actor.envelope import Envelope
from dsi.errors import BadMessage, DsiError, ErrorInfo
from dsi.messages.base import COMMON, Hello, Ping, Pong, Welcome
from dsi.messages.version import CURRENT, Protocol
from dsi.transport.security import CurveKeys, secure_server
from dsi.transport.sockets import STALL_LIMIT_S, FramePump, bound_address, keep_receive_buffers, tune
from dsi.transport.wire import Codec, Kind, pack_header, peek_call_id, peek_version, read_header

log = logging.getLogger(__name__)
_CALLS = (Kind.ASK, Kind.TELL, Kind.STREAM)
_RUNTIME = Hello | Ping


class _RemoteChannel:
    """Answers one call, in the protocol version the call came in (the caller accepts it)."""

    __slots__ = ("_call_id", "_identity", "_server", "_version", "closed", "key")

    def __init__(self, server: ActorServer, identity: bytes, call_id: int, version: int) -> None:
        self._server = server
        self._identity = identity
        self._call_id = call_id
        self._version = version
        self.key = (identity, call_id)
        self.closed = False

    def reply(self, msg: Any) -> None:
        if not self.closed:
            self.closed = True
            self._server.send(self._identity, Kind.REPLY, self._call_id, msg, self._version)

    def fail(self, err: DsiError) -> None:
        if not self.closed:
            self.closed = True
            self._server.send_error(self._identity, self._call_id, err.info(), self._version)

    async def item(self, msg: Any) -> None:
        if not self.closed:
            await self._server.send_async(self._identity, Kind.ITEM, self._call_id, msg, self._version)

    def end(self) -> None:
        if not self.closed:
            self.closed = True
            header = pack_header(Kind.END, self._call_id, self._version)
            self._server.send_raw(self._identity, [header, b""])


class ActorServer:
    """Binds ``address`` and feeds every valid call to ``actor``. ``peer_id`` answers Hello.

    ``protocol``: the versions served (dsi.messages.version); another value only simulates a
    process of another version, in tests."""

    def __init__(
        self,
        actor: Actor,
        address: str,
        ctx: zmq.asyncio.Context,
        *,
        role: str = "",
        keys: CurveKeys | None = None,
        protocol: Protocol = CURRENT,
    ) -> None:
        self.actor = actor
        self.role = role
        self.protocol = protocol
        self.errors_sent = 0
        self._codec = Codec([*actor.message_types, *COMMON])
        # A plain socket driven by a FramePump: pyzmq's asyncio futures cost more than a message.
        self._sock = ctx.socket(zmq.ROUTER, socket_class=zmq.Socket)
        tune(self._sock)
        self._sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a restarted peer takes its identity back
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a full or gone peer is an error, not a silent drop
        secure_server(self._sock, keys)
        self._sock.bind(address)
        self.address = bound_address(self._sock)
        keep_receive_buffers()
        # Copied as bytes: routing id, header, body; blob frames after them stay zero-copy.
        self._pump = FramePump(
            self._sock,
            self._dispatch,
            copied=3,
            name=f"{actor.name} server",
            batch_at=1,
            stall_limit_s=STALL_LIMIT_S,
        )
        self._stalls = self._pump.stalls
        assert self._stalls is not None
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        if not self.actor.running:
            await self.actor.start()
        self._pump.start()
        self._task = asyncio.get_running_loop().create_task(self._serve(), name=f"{self.actor.name}.server")

    async def stop(self) -> None:
        """Stop the actor first (its pending callers get ActorStopped frames), then the socket."""
        await self.actor.stop()
        await asyncio.sleep(0)  # let the error frames go out before the socket closes
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._pump.stop()
        self._sock.close(linger=200)

    # ---- sending (called from channels) ------------------------------------------------------
    def send(self, identity: bytes, kind: Kind, call_id: int, msg: Any, version: int | None = None) -> None:
        """``version``: the protocol version to write it in (default: this server's own)."""
        header = pack_header(kind, call_id, self.protocol.version if version is None else version)
        self.send_raw(identity, [header, *self._codec.encode(msg)])

    async def send_async(
        self, identity: bytes, kind: Kind, call_id: int, msg: Any, version: int | None = None
    ) -> None:
        """Like send, for stream items: while the caller's queue is full, wait (at most the stall
        limit) until it reads again, so a stream goes at its reader's pace."""
        self.send(identity, kind, call_id, msg, version)
        if self._stalls.stalled(identity):
            await self._stalls.wait(identity, self._stalls.limit_s)

    @property
    def dropped(self) -> dict[str, int]:
        """Messages that never left, by reason: ``full`` (the caller read nothing for the stall
        limit), ``gone`` (the caller had disconnected), ``closed`` (held when the server stopped)."""
        return dict(self._stalls.dropped)

    def send_error(self, identity: bytes, call_id: int, info: ErrorInfo, version: int | None = None) -> None:
        self.errors_sent += 1
        header = pack_header(Kind.ERROR, call_id, self.protocol.version if version is None else version)
        self.send_raw(identity, [header, self._codec.encode_error(info)])

    def send_raw(self, identity: bytes, frames: list[Any]) -> None:
        try:
            self._pump.send([identity, *frames])
        except zmq.ZMQError as exc:
            log.debug("%s: dropped frame to a gone peer: %s", self.actor.name, exc)

    # ---- receiving ---------------------------------------------------------------------------
    async def _serve(self) -> None:
        """Lives as long as the server serves; the pump calls ``_dispatch`` for every message."""
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            self._pump.stop()

    def _dispatch(self, frames: list[Any]) -> None:
        """[routing id: bytes, header: bytes, body: bytes, *blobs: zmq.Frame] of one call."""
        identity = frames[0]
        if len(frames) < 3:
            header = frames[1] if len(frames) > 1 else b""
            err = BadMessage("expected header and body frames")
            version = peek_version(header, self.protocol.version)
            self.send_error(identity, peek_call_id(header), err.info(), version)
            return
        header = frames[1]
        # An error goes back in the version of the frame, whatever it is: its sender can read that.
        version = peek_version(header, self.protocol.version)
        try:
            # A Hello of any version is answered: it is how two versions meet.
            version, kind, call_id = read_header(header, self.protocol, any_version=Kind.HELLO)
            if kind is Kind.CANCEL:
                self.actor.cancel((identity, call_id))
                return
            if kind is Kind.BATCH:  # a well-formed one was split by the pump
                raise BadMessage(
                    f"a BATCH that says {call_id} messages must hold that many (2 or more) header and body pairs"
                )
            msg = self._codec.decode(frames[2:])
        except DsiError as exc:
            self.send_error(identity, peek_call_id(header), exc.info(), version)
            return
        if kind is Kind.HELLO or isinstance(msg, _RUNTIME):
            self._answer_runtime(identity, kind, call_id, msg, version)
        elif kind in _CALLS:
            channel = None if kind is Kind.TELL else _RemoteChannel(self, identity, call_id, version)
            if channel is None and not isinstance(msg, self.actor.message_types):
                err = BadMessage(f"{type(msg).__name__} is not a call this role accepts")
                self.send_error(identity, call_id, err.info(), version)
                return
            self.actor.deliver(Envelope(msg, channel, stream=kind is Kind.STREAM))
        else:
            self.send_error(
                identity, call_id, BadMessage(f"{kind.name} frames are replies, not calls").info(), version
            )

    def _answer_runtime(self, identity: bytes, kind: Kind, call_id: int, msg: Any, version: int) -> None:
        if isinstance(msg, Hello) and kind in (Kind.HELLO, Kind.ASK):
            self._welcome(identity, call_id, msg, version)
        elif isinstance(msg, Ping) and kind is Kind.ASK:
            self.send(identity, Kind.REPLY, call_id, Pong(msg.sent_ns), version)
        else:
            self.send_error(
                identity, call_id, BadMessage(f"{type(msg).__name__} must be sent as an ask").info(), version
            )

    def _welcome(self, identity: bytes, call_id: int, hello: Hello, version: int) -> None:
        """Welcome in the version the connection will speak, or version_mismatch in the Hello's."""
        try:
            spoken = self.protocol.spoken_with(hello.version)
        except DsiError as exc:
            log.warning("%s: refused %s (%s): %s", self.actor.name, hello.peer_id, hello.role or "?", exc)
            self.send_error(identity, call_id, exc.info(), version)
            return
        self.send(identity, Kind.REPLY, call_id, Welcome(spoken, self.actor.name, self.role), spoken)
