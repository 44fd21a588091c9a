"""ShmDataPlane: same-host KV transfers through /dev/shm; the sender copies straight into the region.

::

    receiver: slabs /dev/shm/dsi-kvx-<pid>-<hex> (RegionPool), ROUTER for control on tcp://host:port
    sender                                            receiver
    Begin(id, nbytes)                          ───►   claims the region (unknown id: Refuse)
                                               ◄───   Ack
    map the slab file (cached), copy parts into
    [offset, offset + nbytes), 8 MiB per loop turn
    Done(id, nbytes)                           ───►   completes the Inbound
                                               ◄───   Ack(done)

KvTarget.region = msgpack [slab file name, byte offset]. Bytes cross no socket: one memcpy, done by
the sender. Slabs are allocated whole when made and mapped in whole on both sides, so that memcpy
pays no page fault. The receiver's slab files are unlinked at close; a killed receiver's files stay behind
(nothing runs to remove them) and are named by its pid.

Same host only: a sender on another host cannot map the receiver's /dev/shm files, so its send
fails with TransferFailed (and aborts the claimed region) before a byte is written. The bytes
never leave the host and are not encrypted; with ``keys`` the Begin/Done exchange goes over a
keyed link (dsi.transport.kv.link), so only a sender with an allowed client key claims a region.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence
from typing import Any

import msgspec
import zmq

from dsi.errors import TransferFailed
from dsi.kvcache.shm import HostBuffer
from dsi.transport.kv import wire
from dsi.transport.kv.inbound import PlaneStats, ReceiveTable, State
from dsi.transport.kv.link import Dialer, Listener
from dsi.transport.kv.linkkeys import LinkKeys
from dsi.transport.kv.parts import Buffer, byte_views
from dsi.transport.kv.plane import DataPlane
from dsi.transport.kv.regions import Region, RegionPool
from dsi.transport.kv.target import KvTarget

SLICE_BYTES = 8 << 20  # bytes copied per event-loop turn
SLAB_BYTES = 256 << 20
MAPPINGS = 8  # receiver slabs a sender keeps mapped
PREFIX = "dsi-kvx"


class _Descriptor(msgspec.Struct, array_like=True, frozen=True):
    name: str  # file under /dev/shm
    offset: int  # bytes


def _slab(nbytes: int) -> HostBuffer:
    return HostBuffer.create(nbytes, prefix=PREFIX, populate=True)  # no page fault on a write


class ShmDataPlane(DataPlane):
    backend = "shm"

    def __init__(
        self,
        host: str = "127.0.0.1",
        *,
        chunk_bytes: int = SLICE_BYTES,
        slab_bytes: int = SLAB_BYTES,
        ctx: zmq.Context | None = None,
        grace_s: float = 5.0,
        keys: LinkKeys | None = None,
    ) -> None:
        super().__init__(ReceiveTable(RegionPool(_slab, slab_bytes), PlaneStats(), grace_s))
        self.host = host
        self.slice_bytes = chunk_bytes
        self._own_ctx = ctx is None
        self._ctx = ctx or zmq.Context()
        self._listener: Listener | None = None
        self._keys = keys
        self.keyed = keys is not None
        self._dialer = Dialer(self._ctx, "kv-shm", keys)
        self._mapped: collections.OrderedDict[str, HostBuffer] = collections.OrderedDict()

    async def start(self) -> None:
        self._listener = Listener(
            self._ctx, self.host, self._on_request, "kv-shm", self._keys, self._sender_lost
        )
        self.address = self._listener.address

    async def close(self) -> None:
        self._table.close()
        self._dialer.close()
        for mapping in self._mapped.values():
            mapping.close()
        self._mapped.clear()
        if self._listener is not None:
            self._listener.close()
        if self._own_ctx:
            self._ctx.term()

    def region_descriptor(self, region: Region) -> bytes:
        if region.slab < 0:
            return wire.encode(_Descriptor("", 0))
        slab: Any = self._table.pool.slabs[region.slab]
        return wire.encode(_Descriptor(slab.name, region.offset))

    # ---- sender -----------------------------------------------------------------------------
    async def send(self, target: KvTarget, parts: Sequence[Buffer], timeout_s: float) -> None:
        self._check_target(target)
        views = byte_views(parts, target.nbytes)
        where = msgspec.msgpack.decode(target.region, type=_Descriptor)
        out = self._dialer.open(target.address, target.transfer_id)
        begun = False
        try:
            async with asyncio.timeout(timeout_s):
                begun = True  # from here on the receiver may hold the region for us: abort on failure
                out.send(wire.Begin(target.transfer_id, target.nbytes))
                await out.reply()
                await self._copy(views, self._region(where, target.nbytes))
                out.send(wire.Done(target.transfer_id, target.nbytes))
                await out.reply()
        except BaseException as error:
            if begun:
                out.abort()
            self._send_failed(error, target, timeout_s, "not confirmed")
            raise
        finally:
            out.close()
        self._sent(target)

    def _region(self, where: _Descriptor, nbytes: int) -> memoryview:
        """The receiver's region, mapped here (slab mappings are cached, least recently used go)."""
        if nbytes == 0:
            return memoryview(b"")
        mapping = self._mapped.get(where.name)
        if mapping is None:
            try:
                mapping = HostBuffer(where.name, populate=True)
            except (FileNotFoundError, ValueError) as error:
                raise TransferFailed(f"receive region {where.name!r} cannot be mapped: {error}") from None
            self._mapped[where.name] = mapping
            while len(self._mapped) > MAPPINGS:
                self._mapped.popitem(last=False)[1].close()
        self._mapped.move_to_end(where.name)
        if where.offset < 0 or where.offset + nbytes > mapping.nbytes:
            raise TransferFailed(
                f"receive region {where.name!r}+{where.offset} is smaller than {nbytes} bytes"
            )
        return mapping.view[where.offset : where.offset + nbytes]

    async def _copy(self, views: list[memoryview], region: memoryview) -> None:
        """Copy the parts back to back into ``region``, yielding to the loop every ``slice_bytes``."""
        at = since_yield = 0
        for view in views:
            for start in range(0, view.nbytes, self.slice_bytes):
                piece = view[start : start + self.slice_bytes]
                region[at : at + piece.nbytes] = piece
                at += piece.nbytes
                since_yield += piece.nbytes
                if since_yield >= self.slice_bytes:
                    since_yield = 0
                    await asyncio.sleep(0)

    # ---- receiver ---------------------------------------------------------------------------
    def _on_request(self, rid: bytes, msg: Any, payload: list[Any]) -> None:
        assert self._listener is not None
        table, tid = self._table, msg.transfer_id
        if isinstance(msg, wire.Begin):
            try:
                table.begin(tid, msg.nbytes, rid)
            except TransferFailed as error:
                self._listener.refuse(rid, tid, error)
                return
            self._listener.reply(rid, wire.Ack(tid, -1, False))
        elif isinstance(msg, wire.Done):
            inbound = table.get(tid)
            if inbound is None or inbound.state is not State.WRITING or inbound.holder != rid:
                table.stopped(tid)
                self._listener.refuse(rid, tid, TransferFailed(f"transfer {tid!r} expired or was cancelled"))
                return
            table.complete(inbound)
            self._listener.reply(rid, wire.Ack(tid, -1, True))
        elif isinstance(msg, wire.Abort):
            table.sender_aborted(tid, rid)
        else:
            self._listener.refuse(rid, tid, TransferFailed("the shm data plane takes no chunks"))
