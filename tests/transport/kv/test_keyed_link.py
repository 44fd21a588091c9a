"""Keyed data plane links over real sockets on 127.0.0.1: pages arrive byte-exact after a handshake
with the cluster's CURVE keys; a peer without them, or with keys the receiver does not admit, gets
no reply and changes nothing, and the receiver goes on serving good senders; a tampered record
closes its link and fails its transfer; without keys the wire is what it always was."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import zmq
import zmq.asyncio

from dsi.errors import TransferFailed, TransferTimeout
from dsi.transport.kv import DataPlane, KvTarget, make_data_plane, wire
from dsi.transport.kv.handshake import ClientHandshake, SeenEphemerals, accept
from dsi.transport.kv.inbound import State
from dsi.transport.kv.records import Opener, Scratch, Sealer
from dsi.transport.security import CurveKeys
from tests.transport.kv.keys import key_set, link_keys, node_keys
from tests.transport.kv.planes import options

BLOCK = 112 << 10  # bytes: one KV block
TIMEOUT_S = 30.0
REFUSED_S = 0.5  # how long a refused sender waits for the reply that must never come


def _blocks(count: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, count * BLOCK, dtype=np.uint8)


@pytest.fixture
def cluster(tmp_path):
    return key_set(tmp_path / "keys", ("cluster", "prefill"))


@contextlib.asynccontextmanager
async def started(backend: str, keys: CurveKeys | None, **extra: Any) -> AsyncIterator[DataPlane]:
    plane = make_data_plane(backend, "127.0.0.1", keys=keys, **extra)
    await plane.start()
    try:
        yield plane
    finally:
        await plane.close()


@contextlib.contextmanager
def raw_socket(kind: int, address: str | None = None):
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(kind)
    sock.linger = 0
    if address is None:
        sock.bind("tcp://127.0.0.1:*")
    else:
        sock.connect(address)
    try:
        yield sock
    finally:
        sock.close()
        ctx.term()


async def _good_send(receiver: DataPlane, sender: DataPlane, data: np.ndarray, name: str) -> None:
    inbound = receiver.expect(name, data.nbytes, TIMEOUT_S)
    await sender.send(inbound.target, [data[i : i + BLOCK] for i in range(0, data.nbytes, BLOCK)], TIMEOUT_S)
    assert np.array_equal(np.frombuffer(await inbound.wait(), np.uint8), data)
    inbound.release()


@pytest.mark.parametrize("backend", ["tcp", "shm", "rdma"])
async def test_pages_round_trip_over_keyed_links(backend, cluster):
    fabric = options(backend)
    async with started(backend, node_keys(cluster), **fabric) as receiver:
        if backend == "rdma":
            fabric["verbs"] = fabric["verbs"].fabric.device()
        async with started(backend, node_keys(cluster, "prefill"), **fabric) as sender:
            assert receiver.keyed and sender.keyed
            for i in range(3):  # one link, one handshake, three transfers
                await _good_send(receiver, sender, _blocks(200 if i == 0 else 3, seed=i), f"t{i}")
            assert receiver.stats.transfers_in == 3 and receiver.stats.regions_live == 0
            if backend == "tcp":
                assert receiver.sessions.accepted == 1 and receiver.sessions.refused == 0


async def _refused(receiver: DataPlane, sender: DataPlane, error: type[Exception] = TransferTimeout) -> None:
    """``sender`` gets no reply: its send times out, and the receiver's inbound is untouched."""
    inbound = receiver.expect("guarded", 8 * BLOCK, TIMEOUT_S)
    before = receiver.stats
    with pytest.raises(error):
        await sender.send(inbound.target, [_blocks(8, seed=9)], REFUSED_S)
    assert inbound.state is State.PENDING and inbound.received == 0
    assert receiver.stats == before
    inbound.release()


async def test_a_sender_without_keys_gets_nothing_and_the_receiver_serves_on(cluster):
    async with started("tcp", node_keys(cluster)) as receiver:
        async with started("tcp", None) as clear:
            await _refused(receiver, clear)
        assert receiver.sessions.accepted == 0 and receiver.sessions.refused >= 1
        async with started("tcp", node_keys(cluster, "prefill")) as good:
            await _good_send(receiver, good, _blocks(4), "after")
        assert receiver.sessions.accepted == 1


async def test_a_wrong_key_set_or_a_revoked_client_gets_nothing(cluster, tmp_path):
    (cluster.authorized_dir / "prefill.key").unlink()  # revoked before the receiver reads the list
    async with started("tcp", node_keys(cluster)) as receiver:
        async with started("tcp", node_keys(key_set(tmp_path / "other"))) as stranger:
            await _refused(receiver, stranger)
        async with started("tcp", node_keys(cluster, "prefill")) as revoked:
            await _refused(receiver, revoked)
        assert receiver.sessions.accepted == 0 and receiver.sessions.refused == 2
        async with started("tcp", node_keys(cluster)) as good:
            await _good_send(receiver, good, _blocks(4), "after")


async def test_a_keyed_sender_tells_nothing_to_a_clear_receiver(cluster):
    async with started("tcp", None) as receiver, started("tcp", node_keys(cluster)) as sender:
        await _refused(receiver, sender)


async def test_a_tampered_record_closes_the_link_and_fails_its_transfer(cluster):
    keys = link_keys(cluster, "prefill")
    data = _blocks(2)
    async with started("tcp", node_keys(cluster)) as receiver:
        inbound = receiver.expect("tampered", data.nbytes, TIMEOUT_S)
        with raw_socket(zmq.DEALER, receiver.address) as sock:
            handshake = ClientHandshake(keys)
            await sock.send(handshake.hello)
            session = handshake.finish(await asyncio.wait_for(sock.recv(), TIMEOUT_S))
            sealer, opener = Sealer(session.send), Opener(session.receive)

            def chunk(seq: int) -> list[Any]:
                part = memoryview(data[seq * BLOCK : (seq + 1) * BLOCK])
                return sealer.seal(wire.encode(wire.Chunk("tampered", seq * BLOCK, data.nbytes, seq)), [part])

            await sock.send_multipart(chunk(0))
            header, _ = opener.open(await asyncio.wait_for(sock.recv_multipart(), TIMEOUT_S), Scratch())
            assert wire.decode_reply(header) == wire.Ack("tampered", 0, False)
            bad = chunk(1)
            bad[1][100] ^= 1  # one payload bit
            await sock.send_multipart(bad)
            with pytest.raises(TransferFailed, match="link closed"):
                await inbound.wait()
            assert receiver.sessions.rejected == 1
            await sock.send_multipart(chunk(1))  # authentic, but the link is closed: dropped
            assert await sock.poll(int(REFUSED_S * 1000)) == 0
        async with started("tcp", node_keys(cluster)) as good:
            await _good_send(receiver, good, data, "after")


async def test_a_tampered_reply_fails_the_send(cluster):
    keys = link_keys(cluster)
    async with started("tcp", node_keys(cluster, "prefill")) as sender:
        with raw_socket(zmq.ROUTER) as sock:
            address = sock.getsockopt_string(zmq.LAST_ENDPOINT)
            send = asyncio.create_task(
                sender.send(KvTarget("tcp", address, "t", 4, b""), [b"abcd"], TIMEOUT_S)
            )
            rid, hello = await asyncio.wait_for(sock.recv_multipart(), TIMEOUT_S)
            welcome, session = accept(keys, hello, SeenEphemerals())
            await sock.send_multipart([rid, welcome])
            rid, *record = await asyncio.wait_for(sock.recv_multipart(), TIMEOUT_S)
            header, payload = Opener(session.receive).open(record, Scratch())
            assert wire.decode_request(header) == wire.Chunk("t", 0, 4, 0) and bytes(payload[0]) == b"abcd"
            reply = Sealer(session.send).seal(wire.encode(wire.Ack("t", 0, True)))
            reply[0] = reply[0][:-1] + bytes([reply[0][-1] ^ 1])
            await sock.send_multipart([rid, *reply])
            with pytest.raises(TransferFailed, match="failed to open"):
                await asyncio.wait_for(send, TIMEOUT_S)


async def test_without_keys_the_wire_is_unchanged():
    async with started("tcp", None) as sender:
        assert not sender.keyed and sender.sessions is None
        with raw_socket(zmq.ROUTER) as sock:
            address = sock.getsockopt_string(zmq.LAST_ENDPOINT)
            send = asyncio.create_task(
                sender.send(KvTarget("tcp", address, "t", 4, b""), [b"abcd"], TIMEOUT_S)
            )
            rid, header, payload = await asyncio.wait_for(sock.recv_multipart(), TIMEOUT_S)
            assert wire.decode_request(header) == wire.Chunk("t", 0, 4, 0) and payload == b"abcd"
            await sock.send_multipart([rid, wire.encode(wire.Ack("t", 0, True))])
            await asyncio.wait_for(send, TIMEOUT_S)
