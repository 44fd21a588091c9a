"""RdmaDataPlane: one-sided RDMA WRITE WITH IMMEDIATE into the receiver's registered regions.

::

    sender                                              receiver (ROUTER tcp://host:port, RC QP per sender)
    Connect(qpn, lid, gid)        first time only ───►  create + connect a QP, post receives
                                                  ◄───  Connected(qpn, lid, gid)
    Begin(id, nbytes)                             ───►  claim the region (unknown id: Refuse)
                                                  ◄───  Ack
    copy parts into a registered staging region
    WRITE_WITH_IMM chunk i -> addr + i*chunk_bytes ═══►  recv completion: imm = slot|i, count bytes
      (at most ``send_depth`` outstanding per QP,        all bytes in: Inbound completes
       shared by the transfers to that receiver)
                                                  ◄───  Ack(done)
    returns once the Ack and every write completion are in

A failed write leaves an RC queue pair in the error state for good: the sender retires it (the
transfers still queued on it fail; it is destroyed once nothing is outstanding) and the next send
to that receiver connects a new one. A receiver that restarted at the same address refuses Begin
with ``NotConnected``; the sender then connects a new queue pair within the same send.

Receive regions come from a RegionPool of registered slabs; the descriptor (``RdmaRegion``) names
address, rkey, slot and chunk size. Parts are staged through a registered send pool (one memcpy):
KV pools and GPU tensors would be registered once instead (GPU memory through dma-buf, see
``pyverbs_device``), which this interface leaves to a later ``register`` option.

With ``keys`` the ZeroMQ exchange above (Connect/Connected, Begin, Ack, Done) goes over a keyed
link (dsi.transport.kv.link): only a sender that proved an allowed client key gets a queue pair
connected or a region claimed, and queue pair numbers and GIDs travel sealed; the KvTarget (address,
rkey) travels in control-plane messages (CURVE). Not covered: the RDMA WRITEs themselves cross the
fabric in clear, and the fabric's packets are not authenticated by dsi.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq

from dsi.errors import TransferFailed
from dsi.transport.kv import wire
from dsi.transport.kv.inbound import Inbound, PlaneStats, ReceiveTable, State
from dsi.transport.kv.link import Dialer, Listener, Outgoing
from dsi.transport.kv.linkkeys import LinkKeys
from dsi.transport.kv.parts import Buffer, byte_views
from dsi.transport.kv.plane import DataPlane
from dsi.transport.kv.rdma import protocol
from dsi.transport.kv.rdma.verbs import MemoryRegion, QpInfo, Verbs
from dsi.transport.kv.regions import Region, RegionPool

CHUNK_BYTES = 1 << 20
SLAB_BYTES = 256 << 20
RECV_DEPTH = 1024  # receives kept posted per queue pair
COPY_SLICE = 8 << 20  # bytes staged per event-loop turn


class _RegisteredSlab:
    def __init__(self, verbs: Verbs, nbytes: int) -> None:
        self.verbs = verbs
        self.mr: MemoryRegion = verbs.register(nbytes)
        self.view = self.mr.view

    def close(self) -> None:
        self.verbs.deregister(self.mr)


@dataclass(slots=True)
class _Writes:
    """One transfer's writes: the protocol's bookkeeping plus this plane's callbacks."""

    batch: protocol.WriteBatch
    qpn: int
    written: asyncio.Future[None]
    post: Callable[[int], None]  # posts one chunk's work request
    on_idle: Callable[[], None] | None = None  # frees the staging region once nothing is outstanding


class RdmaDataPlane(DataPlane):
    backend = "rdma"

    def __init__(
        self,
        host: str = "127.0.0.1",
        *,
        verbs: Verbs | None = None,
        chunk_bytes: int = CHUNK_BYTES,
        slab_bytes: int = SLAB_BYTES,
        ctx: zmq.Context | None = None,
        grace_s: float = 5.0,
        keys: LinkKeys | None = None,
    ) -> None:
        if verbs is None:
            from dsi.transport.kv.rdma.pyverbs_device import open_device

            verbs = open_device()
        self.verbs = verbs
        super().__init__(ReceiveTable(RegionPool(self._slab, slab_bytes), PlaneStats(), grace_s))
        self.host = host
        self.chunk_bytes = chunk_bytes
        self._send_pool = RegionPool(self._slab, slab_bytes)
        self._own_ctx = ctx is None
        self._ctx = ctx or zmq.Context()
        self._listener: Listener | None = None
        self._keys = keys
        self.keyed = keys is not None
        self._dialer = Dialer(self._ctx, "kv-rdma", keys)
        self._slots = protocol.SlotTable()
        self._slot_of: dict[str, int] = {}
        self._qp_of_sender: dict[bytes, int] = {}  # receiver side: routing id -> local qpn
        self._sender_of_qp: dict[int, bytes] = {}
        self._peers: dict[str, asyncio.Future[int]] = {}  # sender side: address -> local qpn
        self._queues: dict[int, protocol.SendQueue] = {}  # sender side: local qpn -> its send queue
        self._writes: dict[int, _Writes] = {}  # batch number ->
        self._pending_id = ""  # the id expect() is allocating a region for
        self._batch_ids = itertools.count(1)

    def _slab(self, nbytes: int) -> _RegisteredSlab:
        return _RegisteredSlab(self.verbs, nbytes)

    async def start(self) -> None:
        self._listener = Listener(
            self._ctx, self.host, self._on_request, "kv-rdma", self._keys, self._sender_lost
        )
        self.address = self._listener.address
        loop = asyncio.get_running_loop()
        loop.add_reader(self.verbs.fileno(), self._on_completions)

    async def close(self) -> None:
        if self._listener is None:
            return
        self._table.close()
        self._dialer.close()
        for writes in self._writes.values():
            if not writes.written.done():
                writes.written.set_exception(TransferFailed("data plane closed"))
        asyncio.get_running_loop().remove_reader(self.verbs.fileno())
        for qpn in [*self._qp_of_sender.values(), *self._queues]:
            self.verbs.destroy_qp(qpn)
        self._queues.clear()
        self._send_pool.close()
        self.verbs.close()
        self._listener.close()
        self._listener = None
        if self._own_ctx:
            self._ctx.term()

    def region_descriptor(self, region: Region) -> bytes:
        transfer_id = self._pending_id
        slot = self._slots.take(transfer_id, self._table.writable)
        self._slot_of[transfer_id] = slot
        addr = rkey = 0
        if region.slab >= 0:
            slab: Any = self._table.pool.slabs[region.slab]
            addr, rkey = slab.mr.addr + region.offset, slab.mr.rkey
        chunk = protocol.chunk_size(region.nbytes, self.chunk_bytes, self.verbs.max_msg_bytes)
        return wire.encode(protocol.RdmaRegion(addr, rkey, slot, chunk))

    def expect(self, transfer_id: str, nbytes: int, timeout_s: float) -> Inbound:
        self._pending_id = transfer_id  # region_descriptor needs the id for the slot
        return super().expect(transfer_id, nbytes, timeout_s)

    # ---- sender -----------------------------------------------------------------------------
    async def send(self, target: Any, parts: Sequence[Buffer], timeout_s: float) -> None:
        self._check_target(target)
        views = byte_views(parts, target.nbytes)
        where = msgspec.msgpack.decode(target.region, type=protocol.RdmaRegion)
        out = self._dialer.open(target.address, target.transfer_id)
        staging: Region | None = None
        writes: _Writes | None = None
        begun = False
        try:
            async with asyncio.timeout(timeout_s):
                begun = True  # an abort from here on fails the receiver's inbound at once
                qpn = await self._connect(out)
                out.send(wire.Begin(target.transfer_id, target.nbytes))
                try:
                    ack = await out.reply()
                except protocol.NotConnected:  # the receiver restarted at this address: connect anew
                    self._drop_peer(out.address)
                    out.refused = False
                    qpn = await self._connect(out)
                    out.send(wire.Begin(target.transfer_id, target.nbytes))
                    ack = await out.reply()
                if not ack.done:
                    staging = self._send_pool.alloc(target.nbytes)
                    await _copy(views, self._send_pool.view(staging))
                    writes = self._write(qpn, staging, target.nbytes, where)
                    await writes.written  # every write placed (RC), or the first failure
                    await out.reply()  # the receiver counted them all
        except BaseException as error:
            if begun:
                out.abort()
            self._send_failed(error, target, timeout_s, "not confirmed")
            raise
        finally:
            out.close()
            if staging is not None:
                self._free_staging(staging, writes)
        self._sent(target)

    async def _connect(self, out: Outgoing) -> int:
        """The local queue pair connected to the receiver at ``out.address`` (set up on first use,
        and again after the last one broke or the receiver lost it)."""
        peer = self._peers.get(out.address)
        if peer is None:
            peer = self._peers[out.address] = asyncio.get_running_loop().create_future()
            info = self.verbs.create_qp()
            try:
                out.send(wire.Connect(out.transfer_id, info.qpn, info.lid, info.gid))
                remote = await out.reply()
                self.verbs.connect(info.qpn, QpInfo(remote.qpn, remote.lid, remote.gid))
                self._queues[info.qpn] = protocol.SendQueue(self.verbs.send_depth)
            except BaseException as error:
                del self._peers[out.address]
                self.verbs.destroy_qp(info.qpn)
                peer.set_exception(error if isinstance(error, TransferFailed) else TransferFailed(str(error)))
                peer.exception()
                raise
            peer.set_result(info.qpn)
        return await asyncio.shield(peer)

    def _drop_peer(self, address: str) -> None:
        """Forget the queue pair to ``address``: the next send connects a new one. The old one is
        destroyed once its outstanding work requests have completed."""
        peer = self._peers.pop(address, None)
        if peer is None or not peer.done() or peer.exception() is not None:
            return
        queue = self._queues.get(peer.result())
        if queue is not None:
            self._break(peer.result(), queue, "the queue pair was dropped")

    def _write(self, qpn: int, staging: Region, nbytes: int, where: protocol.RdmaRegion) -> _Writes:
        """Queue the chunks on the queue pair's send queue (shared with the other transfers to
        the same receiver, at most ``send_depth`` outstanding); completions post the rest."""
        mr = self._send_pool.slabs[staging.slab].mr  # type: ignore[attr-defined]
        number = next(self._batch_ids)
        batch = protocol.WriteBatch(
            protocol.chunk_plan(nbytes, where.chunk_bytes), self.verbs.send_depth, number
        )

        def post(index: int) -> None:
            offset, length = batch.plan[index]
            self.verbs.post_write_imm(
                qpn,
                number << protocol.CHUNK_BITS | index,
                mr,
                staging.offset + offset,
                length,
                where.addr + offset,
                where.rkey,
                protocol.encode_imm(where.slot, index),
            )

        writes = self._writes[number] = _Writes(batch, qpn, asyncio.get_running_loop().create_future(), post)
        writes.written.add_done_callback(_retrieve)
        self._queues[qpn].waiting.append(batch)
        self._pump(qpn)
        return writes

    def _pump(self, qpn: int) -> None:
        """Post what the queue pair's send queue has room for."""
        queue = self._queues.get(qpn)
        if queue is None or queue.broken:
            return
        for batch, indexes in queue.take():
            writes = self._writes[batch.number]
            for index in indexes:
                writes.post(index)

    def _free_staging(self, staging: Region, writes: _Writes | None) -> None:
        if writes is not None and not writes.batch.error and not writes.batch.finished:
            writes.batch.error = "abandoned by the sender"  # post nothing more
        if writes is None or writes.batch.outstanding == 0:
            if writes is not None:
                self._writes.pop(writes.batch.number, None)
                queue = self._queues.get(writes.qpn)
                if queue is not None and writes.batch in queue.waiting:
                    queue.waiting.remove(writes.batch)
            self._send_pool.free(staging)
        else:  # the device may still read it: free once the last completion is in
            writes.on_idle = lambda: self._send_pool.free(staging)

    # ---- completions ------------------------------------------------------------------------
    def _on_completions(self) -> None:
        self.verbs.arm()
        while completions := self.verbs.poll():
            for completion in completions:
                if completion.recv:
                    self._on_recv(completion)
                else:
                    self._on_written(completion)

    def _on_written(self, completion: Any) -> None:
        queue = self._queues.get(completion.qpn)
        if queue is not None:
            queue.completed()
            if not completion.ok:  # an RC queue pair in error stays so: later sends connect a new one
                self._break(completion.qpn, queue, f"rdma write failed: {completion.error}")
        writes = self._writes.get(completion.wr_id >> protocol.CHUNK_BITS)
        if writes is not None:
            writes.batch.completed(completion.ok, completion.error)
            self._settle(writes)
        if queue is not None:
            self._pump(completion.qpn)
            self._destroy_if_idle(completion.qpn, queue)

    def _settle(self, writes: _Writes) -> None:
        """Resolve a transfer whose writes are all done (or failed with nothing outstanding)."""
        batch = writes.batch
        if not batch.finished:
            return
        if batch.outstanding == 0:
            self._writes.pop(batch.number, None)
            if writes.on_idle is not None:
                writes.on_idle()
        if not writes.written.done():
            if batch.error:
                writes.written.set_exception(TransferFailed(f"rdma write failed: {batch.error}"))
            else:
                writes.written.set_result(None)

    def _break(self, qpn: int, queue: protocol.SendQueue, error: str) -> None:
        """Retire a queue pair: no sender uses it again, and transfers still waiting to post on it fail."""
        queue.broken = True
        for address, peer in list(self._peers.items()):
            if peer.done() and peer.exception() is None and peer.result() == qpn:
                del self._peers[address]
        waiting, queue.waiting = list(queue.waiting), type(queue.waiting)()
        for batch in waiting:
            if not batch.error:
                batch.error = error
            writes = self._writes.get(batch.number)
            if writes is not None:
                self._settle(writes)
        self._destroy_if_idle(qpn, queue)

    def _destroy_if_idle(self, qpn: int, queue: protocol.SendQueue) -> None:
        if queue.broken and queue.outstanding == 0 and self._queues.get(qpn) is queue:
            del self._queues[qpn]
            self.verbs.destroy_qp(qpn)

    def _on_recv(self, completion: Any) -> None:
        rid = self._sender_of_qp.get(completion.qpn)
        if not completion.ok or rid is None:
            return  # flushed by a closing queue pair
        self.verbs.post_recv(completion.qpn, 0)
        slot, index = protocol.decode_imm(completion.imm)
        transfer_id = self._slots.owner(slot)
        inbound = self._table.get(transfer_id) if transfer_id is not None else None
        if inbound is None or inbound.state is not State.WRITING or inbound.holder != rid:
            return  # a late write into a failed transfer's (quarantined) region
        nbytes = inbound.target.nbytes
        chunk = protocol.chunk_size(nbytes, self.chunk_bytes, self.verbs.max_msg_bytes)
        if self._table.received(inbound, protocol.chunk_length(nbytes, chunk, index)):
            assert self._listener is not None
            self._listener.reply(rid, wire.Ack(transfer_id, index, True))

    # ---- receiver requests ------------------------------------------------------------------
    def _on_request(self, rid: bytes, msg: Any, payload: list[Any]) -> None:
        assert self._listener is not None
        table, tid = self._table, msg.transfer_id
        if isinstance(msg, wire.Connect):
            self._accept(rid, msg)
        elif isinstance(msg, wire.Begin):
            if rid not in self._qp_of_sender:
                self._listener.refuse(rid, tid, protocol.NotConnected("Begin before Connect"))
                return
            try:
                inbound = table.begin(tid, msg.nbytes, rid)
            except TransferFailed as error:
                self._listener.refuse(rid, tid, error)
                return
            done = inbound.target.nbytes == 0
            if done:
                table.complete(inbound)
            self._listener.reply(rid, wire.Ack(tid, -1, done))
        elif isinstance(msg, wire.Abort):
            table.sender_aborted(tid, rid)
        else:
            self._listener.refuse(rid, tid, TransferFailed("the rdma data plane takes no chunks"))

    def _accept(self, rid: bytes, msg: wire.Connect) -> None:
        """A new sender: a queue pair of our own, connected to its, with receives posted."""
        assert self._listener is not None
        old = self._qp_of_sender.pop(rid, None)
        if old is not None:
            self._sender_of_qp.pop(old, None)
            self.verbs.destroy_qp(old)
        info = self.verbs.create_qp()
        self.verbs.connect(info.qpn, QpInfo(msg.qpn, msg.lid, msg.gid))
        for _ in range(RECV_DEPTH):
            self.verbs.post_recv(info.qpn, 0)
        self._qp_of_sender[rid] = info.qpn
        self._sender_of_qp[info.qpn] = rid
        self._listener.reply(rid, wire.Connected(msg.transfer_id, info.qpn, info.lid, info.gid))


async def _copy(views: list[memoryview], region: memoryview) -> None:
    """Stage the parts back to back, yielding to the loop every ``COPY_SLICE`` bytes."""
    at = since_yield = 0
    for view in views:
        for start in range(0, view.nbytes, COPY_SLICE):
            piece = view[start : start + COPY_SLICE]
            region[at : at + piece.nbytes] = piece
            at += piece.nbytes
            since_yield += piece.nbytes
            if since_yield >= COPY_SLICE:
                since_yield = 0
                await asyncio.sleep(0)


def _retrieve(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()
