"""Channel: a sender's link to one receiver address, a DEALER socket and its monitor.

Clear (no keys): messages go out as they are; a dropped connection fails the transfers waiting on
it and ZeroMQ connects again by itself. Keyed: the channel sends the Hello at once and holds
messages back until the Welcome proves the receiver (see dsi.transport.kv.handshake), then seals
every message (dsi.transport.kv.records). A missing or false Welcome, a reply that fails to open,
or a dropped connection closes a keyed channel for good: its transfers fail with TransferFailed
and the next send to that address dials a new one, with a new handshake::

    HANDSHAKING ──Welcome──► OPEN ──bad record, disconnect──► CLOSED
        └──────no Welcome in HANDSHAKE_TIMEOUT_S, false Welcome, disconnect──┘
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from dsi.errors import DsiError, TransferFailed
from dsi.transport.kv.handshake import ClientHandshake, HandshakeFailed
from dsi.transport.kv.linkkeys import LinkKeys
from dsi.transport.kv.records import Opener, RecordRejected, Scratch, Sealer
from dsi.transport.sockets import FramePump, tune

HANDSHAKE_TIMEOUT_S = 10.0


class Channel:
    """``on_reply(channel, header)`` gets each reply's header bytes; ``on_down(channel, error)``
    is told of a dropped connection (clear) or of the channel's end (keyed, then ``closed``)."""

    def __init__(
        self,
        ctx: zmq.Context,
        address: str,
        name: str,
        keys: LinkKeys | None,
        on_reply: Callable[[Channel, bytes], None],
        on_down: Callable[[Channel, DsiError], None],
    ) -> None:
        self.address = address
        self.closed = False
        self._on_reply = on_reply
        self._on_down = on_down
        self._loop = asyncio.get_running_loop()
        self._sock = ctx.socket(zmq.DEALER)
        tune(self._sock)
        self._monitor = self._sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._sock.connect(address)
        self._pump = FramePump(self._sock, self._on_frames, copied=2, name=name)
        self._pump.start()
        self._fd = self._monitor.getsockopt(zmq.FD)
        self._loop.add_reader(self._fd, self._on_monitor)
        self._on_monitor()  # ZMQ_FD is edge-triggered: it signals only after a read found nothing
        self._handshake: ClientHandshake | None = None
        self._sealer: Sealer | None = None
        self._opener: Opener | None = None
        self._held: list[tuple[bytes, Sequence[memoryview]]] = []
        self._scratch = Scratch()  # replies carry no payload: it stays empty
        self._timer: asyncio.TimerHandle | None = None
        if keys is not None:
            self._handshake = ClientHandshake(keys)
            self._pump.send([self._handshake.hello])
            self._timer = self._loop.call_later(HANDSHAKE_TIMEOUT_S, self._no_welcome)

    @property
    def keyed(self) -> bool:
        return self._handshake is not None

    def send(self, header: bytes, payload: Sequence[memoryview] = ()) -> None:
        """Queue one message (payload views must stay valid until the transfer ends)."""
        if self.closed:
            raise TransferFailed(f"the link to {self.address} is closed")
        if self._handshake is None:
            self._pump.send([header, *payload])
        elif self._sealer is None:
            self._held.append((header, payload))
        else:
            self._pump.send(self._sealer.seal(header, payload))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        self._held.clear()
        self._loop.remove_reader(self._fd)
        self._monitor.close(linger=0)
        self._pump.stop()
        self._sock.close(linger=0)

    # ---- internals ---------------------------------------------------------------------------
    def _on_frames(self, frames: list[Any]) -> None:
        if self._handshake is None:
            self._on_reply(self, frames[0])
        elif self._opener is None:
            self._welcome(frames)
        else:
            try:
                header, _ = self._opener.open(frames, self._scratch)
            except RecordRejected as error:
                self._end(f"a reply from {self.address} failed to open: {error}")
                return
            self._on_reply(self, header)

    def _welcome(self, frames: list[Any]) -> None:
        assert self._handshake is not None
        try:
            if len(frames) != 1 or not isinstance(frames[0], bytes):
                raise HandshakeFailed("not a Welcome")
            keys = self._handshake.finish(frames[0])
        except HandshakeFailed as error:
            self._end(f"handshake with {self.address} failed: {error}")
            return
        if self._timer is not None:
            self._timer.cancel()
        self._sealer, self._opener = Sealer(keys.send), Opener(keys.receive)
        held, self._held = self._held, []
        for header, payload in held:
            self._pump.send(self._sealer.seal(header, payload))

    def _no_welcome(self) -> None:
        self._end(
            f"no handshake answer from {self.address} in {HANDSHAKE_TIMEOUT_S}s: the receiver has no"
            " data plane keys, or does not admit this node's client key"
        )

    def _end(self, why: str) -> None:
        self.close()
        self._on_down(self, TransferFailed(why))

    def _on_monitor(self) -> None:
        while not self.closed:
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if event["event"] == zmq.EVENT_DISCONNECTED:
                if self.keyed:  # the receiver's next connection has no session: start over
                    self._end(f"receiver at {self.address} went away")
                    return
                self._on_down(self, TransferFailed(f"receiver at {self.address} went away"))
