"""TcpDataPlane: KV transfers as ZeroMQ multipart messages over TCP.

::

    sender (DEALER per receiver)                         receiver (ROUTER, tcp://host:port)
    Chunk(id, offset, total, seq) + payload frames ───►  copy frames into region[offset:...]
        ... up to ``window`` chunks in flight ...   ◄───  Ack(id, seq, done) | Refuse(id, error)
    returns when an Ack says done                        Inbound completes with the last byte

A chunk carries at most ``chunk_bytes`` (default 8 MiB) so a 64 MiB buffer never becomes one giant
message; payload parts travel as zero-copy frames (the sender's buffers, no copy on send), and the
receiver makes the one copy into its region. An unknown or expired id is refused at its first chunk.

With ``keys`` every link is keyed (dsi.transport.kv.link): a chunk travels as a sealed header
frame and one sealed payload frame, encrypted by the sender straight from its parts (one pass, no
copy before) and decrypted by the receiver into a scratch buffer, tag verified, before the same
one copy into the region. A sender
whose link closes on a failed record has its transfers failed at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import zmq

from dsi.errors import TransferFailed
from dsi.transport.kv import wire
from dsi.transport.kv.inbound import PlaneStats, ReceiveTable
from dsi.transport.kv.link import Dialer, Listener, Outgoing
from dsi.transport.kv.linkkeys import LinkKeys
from dsi.transport.kv.parts import Buffer, byte_views, chunks
from dsi.transport.kv.plane import DataPlane
from dsi.transport.kv.regions import AnonymousSlab, RegionPool
from dsi.transport.kv.sessions import SessionCounts
from dsi.transport.kv.target import KvTarget
from dsi.transport.sockets import keep_receive_buffers

CHUNK_BYTES = 8 << 20  # bytes per message
WINDOW = 4  # chunks in flight per transfer
SLAB_BYTES = 256 << 20  # receive pool slab


class TcpDataPlane(DataPlane):
    backend = "tcp"

    def __init__(
        self,
        host: str = "127.0.0.1",
        *,
        chunk_bytes: int = CHUNK_BYTES,
        window: int = WINDOW,
        slab_bytes: int = SLAB_BYTES,
        ctx: zmq.Context | None = None,
        keys: LinkKeys | None = None,
    ) -> None:
        # grace 0: only this process writes a tcp region, so a failed one is free at once
        super().__init__(ReceiveTable(RegionPool(AnonymousSlab, slab_bytes), PlaneStats(), grace_s=0.0))
        self.host = host
        self.chunk_bytes = chunk_bytes
        self.window = window
        self._own_ctx = ctx is None
        self._ctx = ctx or zmq.Context()
        self._listener: Listener | None = None
        self._keys = keys
        self.keyed = keys is not None
        self._dialer = Dialer(self._ctx, "kv-tcp", keys)

    async def start(self) -> None:
        keep_receive_buffers()
        self._listener = Listener(
            self._ctx, self.host, self._on_request, "kv-tcp", self._keys, self._sender_lost
        )
        self.address = self._listener.address

    async def close(self) -> None:
        self._table.close()
        self._dialer.close()
        if self._listener is not None:
            self._listener.close()
        if self._own_ctx:
            self._ctx.term()

    async def send(self, target: KvTarget, parts: Sequence[Buffer], timeout_s: float) -> None:
        self._check_target(target)
        views = byte_views(parts, target.nbytes)
        out = self._dialer.open(target.address, target.transfer_id)
        try:
            async with asyncio.timeout(timeout_s):
                await self._stream(out, target, chunks(views, self.chunk_bytes))
        except BaseException as error:
            out.abort()
            self._send_failed(error, target, timeout_s, "no ack")
            raise
        finally:
            out.close()
        self._sent(target)

    async def _stream(
        self, out: Outgoing, target: KvTarget, plan: list[tuple[int, list[memoryview]]]
    ) -> None:
        """Send the chunks, at most ``window`` unacknowledged; return on the receiver's final ack."""
        next_chunk = acked = 0
        while True:
            while next_chunk < len(plan) and next_chunk - acked < self.window:
                offset, frames = plan[next_chunk]
                out.send(wire.Chunk(target.transfer_id, offset, target.nbytes, next_chunk), frames)
                next_chunk += 1
            ack = await out.reply()
            acked += 1
            if ack.done:
                return
            if acked >= len(plan):
                raise TransferFailed(f"transfer {target.transfer_id!r}: every chunk acked, none said done")

    # ---- receiver ---------------------------------------------------------------------------
    @property
    def sessions(self) -> SessionCounts | None:
        """Handshake counters of a keyed plane (None when clear or not started)."""
        return None if self._listener is None else self._listener.sessions

    def _on_request(self, rid: bytes, msg: Any, payload: list[Any]) -> None:
        assert self._listener is not None
        if isinstance(msg, wire.Abort):
            inbound = self._table.get(msg.transfer_id)
            if inbound is not None:
                self._table.fail(inbound, TransferFailed(f"transfer {msg.transfer_id!r}: the sender aborted"))
            return
        if not isinstance(msg, wire.Chunk):
            self._listener.refuse(
                rid, msg.transfer_id, TransferFailed("the tcp data plane takes chunks only")
            )
            return
        try:
            inbound = self._table.begin(msg.transfer_id, msg.total, rid)
        except TransferFailed as error:
            self._listener.refuse(rid, msg.transfer_id, error)
            return
        end = msg.offset + sum(len(f) for f in payload)
        if msg.offset < 0 or end > inbound.target.nbytes:
            error = TransferFailed(f"transfer {msg.transfer_id!r}: chunk [{msg.offset}, {end}) out of bounds")
            self._table.fail(inbound, error)
            self._listener.refuse(rid, msg.transfer_id, error)
            return
        view, at = inbound.view, msg.offset
        for frame in payload:
            data = frame.buffer if isinstance(frame, zmq.Frame) else frame
            view[at : at + len(data)] = data
            at += len(data)
        done = self._table.received(inbound, end - msg.offset)
        self._listener.reply(rid, wire.Ack(msg.transfer_id, msg.seq, done))
