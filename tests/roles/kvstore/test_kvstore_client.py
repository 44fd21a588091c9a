"""KvstoreClient against a kvstore served on 127.0.0.1: byte-exact fetches into shared memory,
leading runs, batching, the background queue, and misses (not errors) when it is away."""

import asyncio
import time

import numpy as np
import pytest
import zmq.asyncio

from dsi.kvcache.hashchain import unpack
from dsi.messages.kvstore import BlocksRead
from dsi.roles.kvstore.client import FetchedBlocks, KvstoreClient, batches, leading_run
from tests.roles.kvstore.conftest import block_bytes, chain
from tests.transport.procs import free_address

SIZE = 2048


@pytest.fixture
async def ctx():
    context = zmq.asyncio.Context()
    yield context
    context.destroy(linger=0)


async def _client(ctx, address: str, **kwargs) -> KvstoreClient:
    client = KvstoreClient(None, ctx, address=address, **kwargs)
    await client.start()
    return client


async def test_put_then_fetch_is_byte_exact_and_buffers_are_reused(kvstores, ctx):
    run = await kvstores.start()
    client = await _client(ctx, run.address)
    try:
        hashes, data = unpack(chain(10)), block_bytes(10, SIZE)
        stored = await client.put(hashes, data, "agent")
        assert (stored.stored, stored.existed) == (10, 0)
        assert await client.match(hashes) == 10
        with await client.fetch(hashes, SIZE) as got:
            assert got.blocks.shape == (10, SIZE)
            assert [got.blocks[i].tobytes() for i in range(10)] == data
            assert got.torch().shape == (10, SIZE)
        with await client.fetch(hashes[:3], SIZE) as got:  # the released buffer serves again
            assert [got.blocks[i].tobytes() for i in range(3)] == data[:3]
        assert client._shm.created == 1 and client._shm.in_use == 0
        s = client.stats
        assert (s.puts, s.put_blocks, s.fetches, s.fetched_blocks, s.fetch_errors) == (1, 10, 2, 13, 0)
    finally:
        await client.close()


async def test_a_miss_or_a_wrong_size_in_the_middle_ends_the_run(kvstores, ctx):
    run = await kvstores.start()
    client = await _client(ctx, run.address)
    try:
        hashes, data = unpack(chain(8, seed=3)), block_bytes(8, SIZE, seed=3)
        await client.put(hashes[:4] + hashes[5:], data[:4] + data[5:])
        with await client.fetch(hashes, SIZE) as got:
            assert len(got) == 4 and got.blocks[3].tobytes() == data[3]
        other = unpack(chain(3, seed=4))
        await client.put(other, [b"x" * SIZE, b"y" * 100, b"z" * SIZE])
        with await client.fetch(other, SIZE) as got:
            assert len(got) == 1
        assert len(await client.fetch(unpack(chain(2, seed=5)), SIZE)) == 0  # nothing found
        assert client._shm.in_use == 0
    finally:
        await client.close()


async def test_puts_go_in_batches_and_the_background_queue_is_bounded(kvstores, ctx):
    run = await kvstores.start()
    client = await _client(ctx, run.address, max_batch_bytes=3 * SIZE, max_queued_blocks=6)
    try:
        hashes, data = unpack(chain(12, seed=6)), block_bytes(12, SIZE, seed=6)
        stored = await client.put(hashes[:7], data[:7])
        assert stored.stored == 7 and client.stats.puts == 3  # 3 + 3 + 1
        assert client.put_background(hashes[7:], data[7:])
        assert not client.put_background(hashes[:2], data[:2])  # 5 queued + 2 > 6
        assert client.stats.dropped == 2
        await client.flush()
        assert await client.match(hashes) == 12
        assert client.stats.put_errors == 0
    finally:
        await client.close()


async def test_a_kvstore_that_is_away_gives_misses_quickly(ctx):
    client = await _client(ctx, free_address(), match_timeout_s=0.3, timeout_s=0.5, retry_s=30.0)
    try:
        hashes = unpack(chain(4))
        start = time.monotonic()
        assert await client.match(hashes) == 0  # waits out one match timeout
        assert len(await client.fetch(hashes, SIZE)) == 0  # then answers at once
        assert (await client.put(hashes, block_bytes(4, SIZE))).stored == 0
        assert client.put_background(hashes, block_bytes(4, SIZE))  # waits in the queue for the kvstore
        await asyncio.sleep(0.3)
        assert time.monotonic() - start < 2.0
        s = client.stats
        assert s.match_errors == 1 and s.put_errors == 1 and s.unavailable >= 3 and s.fetches == 0
        assert s.put_blocks == 0 and s.dropped == 0
    finally:
        await client.close()
    assert client.stats.dropped == 4  # still queued at close


async def test_a_fetch_that_times_out_does_not_reuse_its_buffer(kvstores, ctx):
    run = await kvstores.start()
    client = await _client(ctx, run.address, timeout_s=5.0)
    try:
        hashes = unpack(chain(2, seed=9))
        await client.put(hashes, block_bytes(2, SIZE, seed=9))
        await kvstores.stop(run)
        client.timeout_s = 0.3
        assert len(await client.fetch(hashes, SIZE)) == 0
        assert client.stats.fetch_errors == 1 and client._shm.idle == 0 and client._shm.in_use == 0
    finally:
        await client.close()


def test_batches_and_leading_run():
    assert batches([10] * 5, 25) == [(0, 2), (2, 4), (4, 5)]
    assert batches([30, 5, 5], 25) == [(0, 1), (1, 3)]
    assert batches([1] * 5, 100, max_blocks=2) == [(0, 2), (2, 4), (4, 5)]
    assert batches([], 10) == []
    assert leading_run(BlocksRead([True, True, False, True], [], [8, 8, 0, 8]), 8) == 2
    assert leading_run(BlocksRead([True, True], [], [8, 7]), 8) == 1
    assert len(FetchedBlocks.empty(16)) == 0


async def test_close_counts_what_was_still_queued(kvstores, ctx):
    run = await kvstores.start()
    client = await _client(ctx, run.address)
    hashes = unpack(chain(3, seed=12))
    client.put_background(hashes, [np.zeros(SIZE, np.uint8)] * 3)
    await client.close()  # before the writer had a turn
    assert client.stats.dropped + client.stats.put_blocks == 3
    await asyncio.sleep(0)


async def test_states_announced_before_the_kvstore_is_up_reach_it_after_the_blocks(kvstores, ctx):
    address = free_address()
    client = await _client(ctx, address, retry_s=0.2)
    try:
        hashes = unpack(chain(3, seed=14))
        assert client.put_background(hashes, block_bytes(3, SIZE, seed=14))
        assert client.announce_states("tcp://127.0.0.1:1", hashes[2:])  # waits behind the put
        await asyncio.sleep(0.3)
        assert client.stats.announced == 0
        await kvstores.start(address)
        await client.flush(timeout=10.0)
        assert client.stats.put_blocks == 3 and client.stats.announced == 1
        for _ in range(50):  # a tell: the kvstore handles it soon after
            if await client.find_state(hashes[2]):
                break
            await asyncio.sleep(0.05)
        assert await client.find_state(hashes[2]) == "tcp://127.0.0.1:1"
        assert await client.find_state(hashes[1]) == ""
    finally:
        await client.close()
