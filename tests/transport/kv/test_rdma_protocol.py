"""The rdma protocol's pure parts, and fake-fabric failures the DataPlane tests do not reach."""

from __future__ import annotations

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
