"""Byte-exact round trips through every backend: many KV blocks as parts, one large buffer, parts of
every accepted kind, and many transfers at once."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from tests.transport.kv.planes import BACKENDS, plane_pair

BLOCK = 112 << 10  # bytes: one KV block
TIMEOUT_S = 60.0


def _random(nbytes: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_thousand_blocks_as_parts(backend):
    data = _random(1000 * BLOCK, 1)
    parts = [data[i * BLOCK : (i + 1) * BLOCK] for i in range(1000)]
    async with plane_pair(backend) as (receiver, sender):
        inbound = receiver.expect("blocks", data.nbytes, TIMEOUT_S)
        assert inbound.target.backend == backend and inbound.target.address == receiver.address
        await sender.send(inbound.target, parts, TIMEOUT_S)
        got = await inbound.wait()
        assert np.array_equal(np.frombuffer(got, np.uint8), data)
        inbound.release()
        assert receiver.stats.regions_live == 0 and receiver.stats.bytes_in == data.nbytes
        assert sender.stats.transfers_out == 1 and sender.stats.bytes_out == data.nbytes


@pytest.mark.parametrize("backend", BACKENDS)
async def test_one_64_mib_buffer(backend):
    data = _random(64 << 20, 2)
    async with plane_pair(backend) as (receiver, sender):
        inbound = receiver.expect("big", data.nbytes, TIMEOUT_S)
        await sender.send(inbound.target, [data], TIMEOUT_S)
        got = bytes(await inbound.wait())
        inbound.release()
        assert got == data.tobytes()


@pytest.mark.parametrize("backend", BACKENDS)
async def test_parts_of_every_kind_and_empty_transfers(backend):
    tensor = torch.arange(3000, dtype=torch.bfloat16).reshape(30, 100)
    parts = [
        b"head",
        bytearray(b"\x01" * 70_000),
        memoryview(b"mv"),
        np.arange(12, dtype=np.float16).reshape(3, 4),
        tensor,
        b"",
    ]
    expected = b"".join(
        [b"head", b"\x01" * 70_000, b"mv", parts[3].tobytes(), tensor.view(torch.uint8).numpy().tobytes()]
    )
    async with plane_pair(backend) as (receiver, sender):
        inbound = receiver.expect("kinds", len(expected), TIMEOUT_S)
        await sender.send(inbound.target, parts, TIMEOUT_S)
        assert bytes(await inbound.wait()) == expected
        inbound.release()
        empty = receiver.expect("empty", 0, TIMEOUT_S)
        await sender.send(empty.target, [], TIMEOUT_S)
        assert bytes(await empty.wait()) == b""
        empty.release()
        assert receiver.stats.regions_live == 0


@pytest.mark.parametrize("backend", BACKENDS)
async def test_many_concurrent_transfers_both_ways(backend):
    sizes = [(i * 37_001) % (3 << 20) + 1 for i in range(48)]
    async with plane_pair(backend) as (a, b):

        async def one(i: int, size: int) -> None:
            receiver, sender = (a, b) if i % 2 else (b, a)
            data = _random(size, 100 + i)
            inbound = receiver.expect(f"t{i}", size, TIMEOUT_S)
            await sender.send(inbound.target, [data[: size // 3], data[size // 3 :]], TIMEOUT_S)
            assert bytes(await inbound.wait()) == data.tobytes()
            inbound.release()

        await asyncio.gather(*(one(i, s) for i, s in enumerate(sizes)))
        for plane in (a, b):
            stats = plane.stats
            assert (stats.transfers_in, stats.transfers_out) == (24, 24)
            assert stats.regions_live == 0 and stats.bytes_live == 0 and stats.failed == 0
