"""KvstoreClient with a controller and a kvstore as real ``dsi-role`` processes: the client finds
the kvstore through the controller, misses quickly while it is killed (-9), and hits the
persisted blocks again once it is restarted on the same directory."""

import asyncio
import time

import pytest
import zmq.asyncio

from dsi.kvcache.hashchain import unpack
from dsi.roles.kvstore.client import KvstoreClient
from tests.dsi.cli.procs import Procs, local_config, python_module
from tests.roles.kvstore.conftest import block_bytes, chain

pytestmark = pytest.mark.slow
SIZE = 4096


def start_role(procs: Procs, config, role: str):
    proc = procs.start(role, python_module("dsi.cli.role", "--config", str(config), "--role", role))
    assert proc.wait_ready() == f"READY {role}"
    return proc


async def until(check, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (result := await check()):
        assert time.monotonic() < deadline, "condition not met"
        await asyncio.sleep(0.1)
    return result


async def test_client_survives_a_kvstore_kill_and_restart(procs, tmp_path):
    config = local_config(tmp_path, keep=["controller-0", "kvstore-0"], interval_s=0.2)
    start_role(procs, config, "controller-0")
    kvstore = start_role(procs, config, "kvstore-0")
    ctx = zmq.asyncio.Context()
    controller = config.read_text().split('controller = "')[1].split('"')[0]
    client = KvstoreClient(controller, ctx, timeout_s=1.0, match_timeout_s=0.5, retry_s=0.3)
    hashes, data = unpack(chain(6)), block_bytes(6, SIZE)
    try:
        await client.start()
        await until(lambda: _put(client, hashes, data))  # the kvstore registers by heartbeat
        with await client.fetch(hashes, SIZE) as got:
            assert [row.tobytes() for row in got.blocks] == data

        kvstore.kill_group()
        start = time.monotonic()
        while time.monotonic() - start < 1.5:  # every call ends within its timeout, as a miss
            t = time.monotonic()
            assert len(await client.fetch(hashes, SIZE)) == 0 and await client.match(hashes) == 0
            assert time.monotonic() - t < 2 * client.timeout_s + 0.5
            client.put_background(hashes, data)
        assert client.stats.fetch_errors + client.stats.unavailable >= 1
        sent = client.stats.put_blocks

        start_role(procs, config, "kvstore-0")  # same directory: the blocks are still there
        got = await until(lambda: _fetch(client, hashes))
        assert [row.tobytes() for row in got.blocks] == data
        got.release()
        await client.flush(10)  # background puts waited for the kvstore and went out once it was back
        assert client.stats.put_blocks > sent
    finally:
        await client.close()
        ctx.destroy(linger=0)


async def test_a_dead_kvstore_is_a_miss_at_once_not_after_the_call_timeout(procs, tmp_path):
    config = local_config(tmp_path, keep=["controller-0", "kvstore-0"], interval_s=0.2)
    start_role(procs, config, "controller-0")
    kvstore = start_role(procs, config, "kvstore-0")
    ctx = zmq.asyncio.Context()
    controller = config.read_text().split('controller = "')[1].split('"')[0]
    # A timeout far above the test's bound: a call that waited for it would fail the wait_for.
    client = KvstoreClient(controller, ctx, timeout_s=60.0, match_timeout_s=60.0, retry_s=0.3)
    hashes, data = unpack(chain(2)), block_bytes(2, SIZE)
    try:
        await client.start()
        await until(lambda: _put(client, hashes, data))
        kvstore.kill_group()  # no call in flight: only the dropped connection tells
        await until(lambda: _away(client))
        for _ in range(5):  # retry_s passes meanwhile: still a miss, still at once
            assert len(await asyncio.wait_for(client.fetch(hashes, SIZE), 5.0)) == 0
            assert await asyncio.wait_for(client.match(hashes), 5.0) == 0
            await asyncio.sleep(client.retry_s)
        assert client.stats.fetch_errors == 0 and client.stats.unavailable >= 10
    finally:
        await client.close()
        ctx.destroy(linger=0)


async def _away(client: KvstoreClient) -> bool:
    return client._peer is not None and client._peer.away


async def _put(client: KvstoreClient, hashes, data) -> bool:
    stored = await client.put(hashes, data)
    return stored.stored + stored.existed == len(hashes)


async def _fetch(client: KvstoreClient, hashes):
    got = await client.fetch(hashes, SIZE)
    if len(got) == len(hashes):
        return got
    got.release()
    return None
