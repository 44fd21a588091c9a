"""CheckReplica against a real kvstore: follows deltas, resyncs after gaps, restarts and restarts
of its own, and ends equal to the store's index."""

import numpy as np
import pytest

from dsi.kvcache.hashchain import unpack
from dsi.kvcache.replica import CheckReplica
from dsi.messages.kvstore import GetBlocks
from tests.roles.kvstore.conftest import block_bytes, chain, put_msg


def key_set(keys: np.ndarray) -> set[bytes]:
    return {k.tobytes() for k in keys}


async def caught_up(replica: CheckReplica, run) -> None:
    await replica.wait_seq(run.actor.epoch, run.actor.seq)


@pytest.fixture
async def replicas(kvstores):
    started: list[CheckReplica] = []

    async def start(run, **kw) -> CheckReplica:
        replica = CheckReplica(run.address, kvstores.ctx, **kw)
        started.append(replica)
        await replica.start()
        return replica

    yield start
    for replica in started:
        await replica.stop()


async def test_replica_equals_the_store_after_10000_puts_with_a_restart_midway(kvstores, replicas):
    run = await kvstores.start(capacity_blocks=6000, publish_interval_s=0.05)
    replica = await replicas(run)
    hashes = chain(10_000, seed=3)
    payload = block_bytes(1, size=64)[0]
    for start in range(0, 10_000, 50):
        await run.peer.ask(put_msg(hashes[start * 16 : (start + 50) * 16], [payload] * 50))
        if start == 5000:
            await replica.stop()
            replica = await replicas(run)
    await caught_up(replica, run)
    store_keys = key_set(run.actor.store.index.all_keys())
    assert len(store_keys) == 6000 - 6000 // 256  # full: each batch evicts its size + the slack
    assert key_set(replica.state.all()) == store_keys
    assert replica.match(hashes) == 0 and replica.match(hashes[-16:]) == 1


async def test_replica_matches_locally_and_resyncs_after_a_gap(kvstores, replicas):
    run = await kvstores.start(publish_interval_s=0.05)
    replica = await replicas(run)
    hashes, data = chain(8), block_bytes(8)
    await run.peer.ask(put_msg(hashes[: 4 * 16], data[:4]))
    await caught_up(replica, run)
    assert replica.match(hashes) == 4
    resyncs = replica.state.resyncs
    replica.state.seq -= 1  # as if a delta had been lost
    await run.peer.ask(put_msg(hashes[4 * 16 :], data[4:]))
    await caught_up(replica, run)
    assert replica.state.resyncs > resyncs and replica.state.gaps >= 1
    assert replica.match(hashes) == 8


async def test_replica_follows_a_kvstore_restart_and_a_corrupt_block(kvstores, replicas):
    run = await kvstores.start(publish_interval_s=0.05)
    replica = await replicas(run, silence_s=0.5)
    hashes, data = chain(6), block_bytes(6)
    await run.peer.ask(put_msg(hashes, data))
    await caught_up(replica, run)
    address = run.address
    await kvstores.stop(run)
    run = await kvstores.start(address, publish_interval_s=0.05)  # new epoch, new publish port
    await caught_up(replica, run)
    assert replica.match(hashes) == 6
    # Corrupt block 3: the read drops it and the replica hears so.
    rec = run.actor.store.index.record(unpack(hashes)[3])
    path = kvstores.store_dir / f"seg-{rec.segment:08d}.kv"
    with open(path, "r+b") as f:
        f.seek(rec.offset)
        f.write(b"garbage")
    assert (await run.peer.ask(GetBlocks(unpack(hashes)))).found == [True] * 3 + [False] + [True] * 2
    await caught_up(replica, run)
    assert replica.match(hashes) == 3
