"""The data plane's ZeroMQ channel: a ROUTER that receivers listen on, DEALERs that senders dial.

Both move frames with the control plane's FramePump (one loop callback per message, zero-copy
frames for payloads of 64 KiB and more). A sender's Channel (DEALER) per receiver address is
cached; a socket monitor turns a dropped connection (receiver killed or closed) into
TransferFailed for every transfer waiting on that receiver, instead of a timeout.

With ``keys`` (the node's CURVE keys, dsi.transport.kv.linkkeys) every connection starts with a
handshake that proves both ends' keys and then carries sealed records only (AES-256-GCM; see
dsi.transport.kv.handshake and .records): the Listener keeps one Session per sender
(dsi.transport.kv.sessions), the Dialer one keyed Channel per receiver (dsi.transport.kv.channel).
Both ends of a link need keys: a keyed end and a clear end never exchange a message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import msgspec
import zmq

from dsi.errors import DsiError, TransferFailed, error_from_info
from dsi.transport.kv import wire
from dsi.transport.kv.channel import Channel
from dsi.transport.kv.linkkeys import LinkKeys
from dsi.transport.kv.sessions import SessionCounts, Sessions
from dsi.transport.sockets import FramePump, bound_address, tune

log = logging.getLogger(__name__)

# (routing id, message, payload frames); keyed, the payload is one view valid during the call only
Handler = Callable[[bytes, Any, list[Any]], None]
LostHandler = Callable[[bytes], None]  # a keyed sender's link closed (routing id)


class Listener:
    """ROUTER bound on ``tcp://host:*``; hands each decoded request to ``handle``. Keyed, it
    tells ``on_lost`` of a sender whose link it closed (a record failed)."""

    def __init__(
        self,
        ctx: zmq.Context,
        host: str,
        handle: Handler,
        name: str,
        keys: LinkKeys | None = None,
        on_lost: LostHandler | None = None,
    ) -> None:
        self._sock = ctx.socket(zmq.ROUTER)
        tune(self._sock)
        self._sock.bind(f"tcp://{host}:*")
        self.address = bound_address(self._sock)
        self._handle = handle
        self._on_lost = on_lost
        self._pump = FramePump(self._sock, self._on_message, copied=2, name=name)
        self._sessions = None if keys is None else Sessions(keys, self._pump.send, self._lost)
        self._pump.start()

    @property
    def sessions(self) -> SessionCounts | None:
        """Handshake counters of a keyed listener (None when clear)."""
        return None if self._sessions is None else self._sessions.counts

    def reply(self, rid: bytes, msg: wire.ToSender) -> None:
        if self._sessions is None:
            self._pump.send([rid, wire.encode(msg)])
            return
        frames = self._sessions.seal(rid, wire.encode(msg))
        if frames is not None:  # else the sender's link was closed: nothing goes to it
            self._pump.send(frames)

    def refuse(self, rid: bytes, transfer_id: str, error: DsiError) -> None:
        self.reply(rid, wire.Refuse(transfer_id, error.info()))

    def close(self) -> None:
        self._pump.stop()
        self._sock.close(linger=0)

    def _on_message(self, frames: list[Any]) -> None:
        if len(frames) < 2:
            return
        rid = frames[0]
        if self._sessions is None:
            header, payload = frames[1], frames[2:]
        else:
            opened = self._sessions.receive(rid, frames[1:])
            if opened is None:
                return
            header, payload = opened
        try:
            msg = wire.decode_request(header)
        except msgspec.DecodeError:
            log.warning("kv data plane: undecodable message dropped")
            return
        self._handle(rid, msg, payload)

    def _lost(self, rid: bytes, why: str) -> None:
        if self._on_lost is not None:
            self._on_lost(rid)


class Outgoing:
    """One transfer in flight from this process: its replies arrive here, in order."""

    def __init__(self, dialer: Dialer, channel: Channel, transfer_id: str) -> None:
        self.address = channel.address
        self.transfer_id = transfer_id
        self.channel = channel
        self._dialer = dialer
        self._replies: asyncio.Queue[wire.Ack | wire.Connected | DsiError] = asyncio.Queue()
        self.refused = False

    def send(self, msg: wire.ToReceiver, payload: list[Any] = ()) -> None:  # type: ignore[assignment]
        self.channel.send(wire.encode(msg), payload)

    def abort(self) -> None:
        """Tell the receiver this sender gave up (best effort: the channel may be gone already)."""
        if not self.refused:
            with contextlib.suppress(zmq.ZMQError, TransferFailed):
                self.send(wire.Abort(self.transfer_id))

    async def reply(self) -> Any:
        """The next Ack (or Connected); raises the receiver's error (TransferFailed) or a lost connection's."""
        got = await self._replies.get()
        if isinstance(got, DsiError):
            self.refused = True
            raise got
        return got

    def deliver(self, reply: wire.Ack | wire.Connected | DsiError) -> None:
        self._replies.put_nowait(reply)

    def close(self) -> None:
        self._dialer.forget(self)


class Dialer:
    """Channels to receivers, one per address, kept for reuse (a closed keyed one is dialled anew)."""

    def __init__(self, ctx: zmq.Context, name: str, keys: LinkKeys | None = None) -> None:
        self._ctx = ctx
        self._name = name
        self._keys = keys
        self._channels: dict[str, Channel] = {}
        self._outgoing: dict[str, Outgoing] = {}
        self._closed = False

    def open(self, address: str, transfer_id: str) -> Outgoing:
        if transfer_id in self._outgoing:
            raise ValueError(f"transfer {transfer_id!r} is already being sent from this process")
        out = self._outgoing[transfer_id] = Outgoing(self, self.channel(address), transfer_id)
        return out

    def forget(self, out: Outgoing) -> None:
        if self._outgoing.get(out.transfer_id) is out:
            del self._outgoing[out.transfer_id]

    def channel(self, address: str) -> Channel:
        channel = self._channels.get(address)
        if channel is None:
            if self._closed:
                raise TransferFailed("data plane closed")
            channel = Channel(self._ctx, address, self._name, self._keys, self._on_reply, self._on_down)
            self._channels[address] = channel
        return channel

    def fail_all(self, error: DsiError) -> None:
        for out in list(self._outgoing.values()):
            out.deliver(error)

    def close(self) -> None:
        self._closed = True
        self.fail_all(TransferFailed("data plane closed"))
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    def _on_reply(self, channel: Channel, header: bytes) -> None:
        try:
            reply = wire.decode_reply(header)
        except msgspec.DecodeError:
            log.warning("kv data plane: undecodable reply dropped")
            return
        out = self._outgoing.get(reply.transfer_id)
        if out is None or out.channel is not channel:
            return  # a late reply for a transfer that already ended
        out.deliver(error_from_info(reply.error) if isinstance(reply, wire.Refuse) else reply)

    def _on_down(self, channel: Channel, error: DsiError) -> None:
        """A dropped connection (clear) or a closed keyed channel: its transfers fail."""
        if channel.closed and self._channels.get(channel.address) is channel:
            del self._channels[channel.address]
        for out in list(self._outgoing.values()):
            if out.channel is channel:
                out.deliver(error)
