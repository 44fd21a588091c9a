"""The data plane's ZeroMQ channel: a ROUTER that receivers listen on, DEALERs that senders dial.

Both move frames with the control plane's FramePump (one loop callback per message, zero-copy
frames for payloads of 64 KiB and more). A sender's DEALER per receiver address is cached; a
socket monitor turns a dropped connection (receiver killed or closed) into TransferFailed for every
transfer waiting on that receiver, instead of a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import msgspec
import zmq
from zmq.utils.monitor import recv_monitor_message

from dsi.errors import DsiError, TransferFailed, error_from_info
from dsi.transport.kv import wire
from dsi.transport.sockets import FramePump, bound_address, tune

log = logging.getLogger(__name__)

Handler = Callable[[bytes, Any, list[Any]], None]  # (routing id, message, payload frames)


class Listener:
    """ROUTER bound on ``tcp://host:*``; hands each decoded request to ``handle``."""

    def __init__(self, ctx: zmq.Context, host: str, handle: Handler, name: str) -> None:
        self._sock = ctx.socket(zmq.ROUTER)
        tune(self._sock)
        self._sock.bind(f"tcp://{host}:*")
        self.address = bound_address(self._sock)
        self._handle = handle
        self._pump = FramePump(self._sock, self._on_message, copied=2, name=name)
        self._pump.start()

    def reply(self, rid: bytes, msg: wire.ToSender) -> None:
        self._pump.send([rid, wire.encode(msg)])

    def refuse(self, rid: bytes, transfer_id: str, error: DsiError) -> None:
        self.reply(rid, wire.Refuse(transfer_id, error.info()))

    def close(self) -> None:
        self._pump.stop()
        self._sock.close(linger=0)

    def _on_message(self, frames: list[Any]) -> None:
        if len(frames) < 2:
            return
        try:
            msg = wire.decode_request(frames[1])
        except msgspec.DecodeError:
            log.warning("kv data plane: undecodable message dropped")
            return
        self._handle(frames[0], msg, frames[2:])


class Outgoing:
    """One transfer in flight from this process: its replies arrive here, in order."""

    def __init__(self, dialer: Dialer, address: str, transfer_id: str) -> None:
        self.address = address
        self.transfer_id = transfer_id
        self._dialer = dialer
        self._replies: asyncio.Queue[wire.Ack | wire.Connected | DsiError] = asyncio.Queue()
        self.refused = False

    def send(self, msg: wire.ToReceiver, payload: list[Any] = ()) -> None:  # type: ignore[assignment]
        self._dialer.pump(self.address).send([wire.encode(msg), *payload])

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
    """DEALER sockets to receivers, one per address, kept for reuse."""

    def __init__(self, ctx: zmq.Context, name: str) -> None:
        self._ctx = ctx
        self._name = name
        self._pumps: dict[str, FramePump] = {}
        self._sockets: list[zmq.Socket] = []
        self._monitors: dict[int, tuple[zmq.Socket, str]] = {}
        self._outgoing: dict[str, Outgoing] = {}
        self._closed = False

    def open(self, address: str, transfer_id: str) -> Outgoing:
        if transfer_id in self._outgoing:
            raise ValueError(f"transfer {transfer_id!r} is already being sent from this process")
        self.pump(address)
        out = self._outgoing[transfer_id] = Outgoing(self, address, transfer_id)
        return out

    def forget(self, out: Outgoing) -> None:
        if self._outgoing.get(out.transfer_id) is out:
            del self._outgoing[out.transfer_id]

    def pump(self, address: str) -> FramePump:
        pump = self._pumps.get(address)
        if pump is None:
            if self._closed:
                raise TransferFailed("data plane closed")
            sock = self._ctx.socket(zmq.DEALER)
            tune(sock)
            monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            sock.connect(address)
            pump = self._pumps[address] = FramePump(sock, self._on_reply, copied=2, name=self._name)
            pump.start()
            self._sockets.append(sock)
            fd = monitor.getsockopt(zmq.FD)
            self._monitors[fd] = (monitor, address)
            asyncio.get_running_loop().add_reader(fd, self._on_monitor, fd)
            self._on_monitor(fd)  # ZMQ_FD is edge-triggered: it signals only after a read found nothing
        return pump

    def fail_all(self, error: DsiError) -> None:
        for out in list(self._outgoing.values()):
            out.deliver(error)

    def close(self) -> None:
        self._closed = True
        self.fail_all(TransferFailed("data plane closed"))
        loop = asyncio.get_running_loop()
        for fd, (monitor, _) in self._monitors.items():
            loop.remove_reader(fd)
            monitor.close(linger=0)
        for pump in self._pumps.values():
            pump.stop()
        for sock in self._sockets:
            sock.close(linger=0)
        self._monitors.clear()
        self._pumps.clear()
        self._sockets.clear()

    def _on_reply(self, frames: list[Any]) -> None:
        try:
            reply = wire.decode_reply(frames[0])
        except msgspec.DecodeError:
            log.warning("kv data plane: undecodable reply dropped")
            return
        out = self._outgoing.get(reply.transfer_id)
        if out is None:
            return  # a late reply for a transfer that already ended
        out.deliver(error_from_info(reply.error) if isinstance(reply, wire.Refuse) else reply)

    def _on_monitor(self, fd: int) -> None:
        monitor, address = self._monitors[fd]
        while True:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if event["event"] == zmq.EVENT_DISCONNECTED:
                for out in list(self._outgoing.values()):
                    if out.address == address:
                        out.deliver(TransferFailed(f"receiver at {address} went away"))
