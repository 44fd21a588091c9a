"""Publish / subscribe: index deltas, cluster events.

Frames: ``[topic][header(PUBLISH, seq)][body][blobs...]``. The publisher numbers messages per
topic from 1; a subscriber that sees a gap (a restart, a slow-joiner loss, an HWM drop) knows it
missed something and must resync from the source of truth - PUB/SUB itself never retransmits.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any, NamedTuple

import zmq
import zmq.asyncio

from dsi.errors import DsiError
from dsi.transport.security import CurveKeys, secure_client, secure_server
from dsi.transport.sockets import bound_address, tune
from dsi.transport.wire import Codec, Kind, pack_header, unpack_header

log = logging.getLogger(__name__)


class Published(NamedTuple):
    topic: str
    seq: int
    msg: Any


class Publisher:
    def __init__(self, address: str, ctx: zmq.asyncio.Context, *, keys: CurveKeys | None = None) -> None:
        self._codec = Codec([object])
        self._seq: dict[str, int] = {}
        self._sock = ctx.socket(zmq.PUB)
        tune(self._sock)
        secure_server(self._sock, keys)
        self._sock.bind(address)
        self.address = bound_address(self._sock)

    def publish(self, topic: str, msg: Any) -> int:
        """Send ``msg`` on ``topic``; returns its sequence number. Never blocks (PUB drops at HWM)."""
        seq = self._seq.get(topic, 0) + 1
        self._seq[topic] = seq
        frames = [topic.encode(), pack_header(Kind.PUBLISH, seq), *self._codec.encode(msg)]
        self._sock.send_multipart(frames, copy=False)
        return seq

    def close(self) -> None:
        self._sock.close(linger=0)


class Subscriber:
    """Async iterator of ``Published`` for the given topic prefixes ("" = everything)."""

    def __init__(
        self,
        address: str,
        ctx: zmq.asyncio.Context,
        *,
        types: Sequence[type],
        topics: Sequence[str] = ("",),
        keys: CurveKeys | None = None,
    ) -> None:
        self._codec = Codec(list(types))
        self._sock = ctx.socket(zmq.SUB)
        tune(self._sock)
        secure_client(self._sock, keys)
        for topic in topics:
            self._sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self._sock.connect(address)
        self.bad_frames = 0

    async def recv(self) -> Published:
        """The next valid message (bad ones are counted and skipped). Safe to cancel."""
        while True:
            frames = await self._sock.recv_multipart(copy=False)
            try:
                if len(frames) < 3:
                    raise DsiError("short pub/sub message")
                kind, seq = unpack_header(frames[1].buffer)
                if kind is not Kind.PUBLISH:
                    raise DsiError(f"{kind.name} frame on a pub/sub socket")
                return Published(frames[0].bytes.decode(), seq, self._codec.decode(frames[2:]))
            except (DsiError, UnicodeDecodeError) as exc:
                self.bad_frames += 1
                log.warning("subscriber: dropped a bad message: %s", exc)

    async def __aiter__(self) -> AsyncIterator[Published]:
        while True:
            yield await self.recv()

    def close(self) -> None:
        self._sock.close(linger=0)
