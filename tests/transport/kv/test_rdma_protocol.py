"""The rdma protocol's pure parts, and fake-fabric failures the DataPlane tests do not reach."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from dsi.transport.kv import TransferFailed
from dsi.transport.kv.rdma import protocol
from dsi.transport.kv.rdma.protocol import RdmaRegion, WriteBatch
from tests.transport.kv.planes import plane_pair


def test_immediate_round_trips_slot_and_chunk():
    for slot, chunk in [(0, 0), (1, 2), (protocol.SLOTS - 1, protocol.MAX_CHUNKS - 1)]:
        assert protocol.decode_imm(protocol.encode_imm(slot, chunk)) == (slot, chunk)
        assert protocol.encode_imm(slot, chunk) < 1 << 32
    with pytest.raises(ValueError):
        protocol.encode_imm(protocol.SLOTS, 0)


def test_chunk_plan_and_sizes():
    assert protocol.chunk_plan(10, 4) == [(0, 4), (4, 4), (8, 2)]
    assert protocol.chunk_plan(0, 4) == []
    assert [protocol.chunk_length(10, 4, i) for i in range(4)] == [4, 4, 2, 0]
    assert protocol.chunk_size(64 << 20, 1 << 20, 1 << 30) == 1 << 20
    assert protocol.chunk_size(64 << 20, 1 << 20, 4096) == 4096  # under the device limit
    assert protocol.chunk_size(1 << 42, 1 << 20, 1 << 30) == (1 << 42) >> protocol.CHUNK_BITS
    with pytest.raises(ValueError):
        protocol.chunk_size(1 << 42, 1 << 20, 1 << 20)


def test_slots_rotate_and_skip_busy_ones():
    slots = protocol.SlotTable()
    busy = {"a"}
    a = slots.take("a", busy.__contains__)
    b = slots.take("b", busy.__contains__)
    assert (a, b) == (0, 1) and slots.owner(0) == "a"
    for i in range(protocol.SLOTS - 2):
        slots.take(f"x{i}", busy.__contains__)
    assert slots.take("c", busy.__contains__) == 1  # slot 0 is still busy with "a"


def test_write_batch_keeps_a_window_and_records_the_first_error():
    batch = WriteBatch(protocol.chunk_plan(10, 2), window=2)
    assert batch.to_post() == [0, 1] and batch.to_post() == []
    batch.completed(True)
    assert batch.to_post() == [2]
    batch.completed(False, "remote access error")
    batch.completed(True)
    assert batch.to_post() == [] and batch.error == "remote access error" and batch.finished


async def test_a_bad_rkey_is_a_transfer_failed_and_frees_everything():
    async with plane_pair("rdma") as (receiver, sender):
        inbound = receiver.expect("k", 3 << 20, 5.0)
        where = msgspec.msgpack.decode(inbound.target.region, type=RdmaRegion)
        bad = msgspec.structs.replace(where, rkey=where.rkey + 999)
        target = msgspec.structs.replace(inbound.target, region=msgspec.msgpack.encode(bad))
        with pytest.raises(TransferFailed, match="remote access"):
            await sender.send(target, [bytes(3 << 20)], 5.0)
        with pytest.raises(TransferFailed, match="aborted"):
            await inbound.wait()
        assert sender._send_pool.live == 0


def test_rdma_without_a_device_is_a_clear_error():
    from dsi.transport.kv import make_data_plane
    from dsi.transport.kv.rdma.pyverbs_device import device_names

    if device_names():
        pytest.skip("this machine has an RDMA device")
    with pytest.raises(RuntimeError, match="no RDMA device"):
        make_data_plane("rdma")


def test_a_send_queue_shares_its_depth_between_transfers_first_come_first_served():
    queue = protocol.SendQueue(depth=4)
    a = WriteBatch(protocol.chunk_plan(10, 2), window=3, number=1)  # 5 chunks
    b = WriteBatch(protocol.chunk_plan(6, 2), window=3, number=2)  # 3 chunks
    queue.waiting.extend([a, b])
    assert [(batch.number, idx) for batch, idx in queue.take()] == [(1, [0, 1, 2]), (2, [0])]
    assert queue.outstanding == 4 and queue.take() == []
    queue.completed()
    a.completed(True)
    assert [(batch.number, idx) for batch, idx in queue.take()] == [(1, [3])]
    for _ in range(4):
        queue.completed()
    for _ in range(3):
        a.completed(True)
    b.completed(True)
    assert [(batch.number, idx) for batch, idx in queue.take()] == [(1, [4]), (2, [1, 2])]
    assert list(queue.waiting) == []  # both posted everything


async def test_concurrent_transfers_to_one_receiver_stay_within_its_send_queue():
    from dsi.transport.kv.rdma.fake import FakeFabric

    fabric = FakeFabric(send_depth=8)
    async with plane_pair("rdma", fabric, chunk_bytes=4096) as (receiver, sender):
        payloads = [bytes([i]) * (256 << 10) for i in range(8)]  # 64 chunks each, 8 at once
        inbounds = [receiver.expect(f"t{i}", len(p), 10.0) for i, p in enumerate(payloads)]
        await asyncio.gather(
            *(sender.send(inb.target, [p], 10.0) for inb, p in zip(inbounds, payloads, strict=True))
        )
        for inb, p in zip(inbounds, payloads, strict=True):
            assert bytes(await inb.wait()) == p
            inb.release()
        assert sender._send_pool.live == 0 and not sender._writes


async def test_a_broken_queue_pair_is_replaced_on_the_next_send():
    from dsi.transport.kv.rdma.fake import FakeFabric

    fabric = FakeFabric()
    async with plane_pair("rdma", fabric) as (receiver, sender):
        await _round_trip(receiver, sender, "a")
        for qpn in list(receiver._qp_of_sender.values()):  # the receiver's queue pair is gone
            fabric.qps.pop(qpn)
        with pytest.raises(TransferFailed, match="rdma write failed"):
            await _round_trip(receiver, sender, "b")
        await _round_trip(receiver, sender, "c")  # a new queue pair, connected on this send
        assert sender._send_pool.live == 0 and len(sender._queues) == 1


async def test_a_receiver_that_lost_our_queue_pair_is_reconnected_within_the_send():
    from dsi.transport.kv.rdma.fake import FakeFabric

    fabric = FakeFabric()
    async with plane_pair("rdma", fabric) as (receiver, sender):
        await _round_trip(receiver, sender, "a")
        for qpn in list(receiver._qp_of_sender.values()):  # as a receiver restarted at this address
            receiver.verbs.destroy_qp(qpn)
        receiver._qp_of_sender.clear()
        receiver._sender_of_qp.clear()
        await _round_trip(receiver, sender, "b")  # Begin is refused NotConnected; the send connects anew
        assert len(sender._queues) == 1 and sender._send_pool.live == 0


async def _round_trip(receiver, sender, tid: str) -> None:
    payload = tid.encode() * (3 << 18)
    inbound = receiver.expect(tid, len(payload), 5.0)
    try:
        await sender.send(inbound.target, [payload], 5.0)
        assert bytes(await inbound.wait()) == payload
    finally:
        inbound.release()
