"""The kvstore role over real sockets: put / get / match / stats, shared-memory reads, restarts."""

import asyncio

import pytest

from dsi.errors import DsiError
from dsi.kvcache.hashchain import unpack
from dsi.kvcache.segments import segment_path
from dsi.kvcache.shm import HostBuffer
from dsi.messages.blob import Blob
from dsi.messages.kvstore import GetBlocks, GetIndexInfo, GetStats, MatchPrefix, PutBlock
from tests.roles.kvstore.conftest import block_bytes, chain, put_msg


async def test_put_match_get_and_stats(kvstores):
    run = await kvstores.start()
    hashes, data = chain(6), block_bytes(6)
    stored = await run.peer.ask(put_msg(hashes, data))
    assert (stored.stored, stored.existed) == (6, 0)
    again = await run.peer.ask(PutBlock(unpack(hashes)[0], Blob(data[0])))
    assert (again.stored, again.existed) == (0, 1)
    assert (await run.peer.ask(MatchPrefix(unpack(hashes)))).hit_blocks == 6
    other = unpack(chain(2, seed=9))
    read = await run.peer.ask(GetBlocks([*unpack(hashes)[:3], *other]))
    assert read.found == [True, True, True, False, False]
    assert [bytes(b.buffer) for b in read.data] == data[:3]
    assert read.sizes == [2048] * 3 + [0, 0]
    stats = await run.peer.ask(GetStats())
    assert (stats.blocks, stats.hits, stats.misses, stats.stored, stats.corrupt) == (6, 3, 2, 6, 0)
    assert stats.seq == run.actor.seq >= 1


async def test_reads_land_in_shared_memory(kvstores):
    run = await kvstores.start()
    hashes, data = chain(4), block_bytes(4, size=3000)
    await run.peer.ask(put_msg(hashes, data))
    with HostBuffer.create(64 + 4 * 4096) as buf:
        read = await run.peer.ask(GetBlocks(unpack(hashes), buf.name, shm_offset=64, stride=4096))
        assert read.found == [True] * 4 and read.data == []
        for i, d in enumerate(data):
            assert bytes(buf.view[64 + i * 4096 : 64 + i * 4096 + 3000]) == d
        with pytest.raises(DsiError, match="do not fit"):
            await run.peer.ask(GetBlocks(unpack(hashes), buf.name, shm_offset=64 * 1024, stride=4096))
        with pytest.raises(DsiError, match="more than the stride"):
            await run.peer.ask(GetBlocks(unpack(hashes), buf.name, stride=1024))
    with pytest.raises(DsiError, match="bad shared-memory name"):
        await run.peer.ask(GetBlocks(unpack(hashes), "../etc/passwd", stride=4096))
    # The failed calls left no segment pinned: reads still work.
    assert (await run.peer.ask(GetBlocks(unpack(hashes)[:1]))).found == [True]


async def test_hits_survive_a_kvstore_restart(kvstores):
    run = await kvstores.start(fsync="always")
    hashes, data = chain(10), block_bytes(10)
    await run.peer.ask(put_msg(hashes, data, "agent"))
    address, epoch = run.address, run.actor.epoch
    await kvstores.stop(run)
    run = await kvstores.start(address)
    assert run.actor.epoch != epoch
    assert (await run.peer.ask(MatchPrefix(unpack(hashes)))).hit_blocks == 10
    read = await run.peer.ask(GetBlocks(unpack(hashes)))
    assert [bytes(b.buffer) for b in read.data] == data


async def test_flipped_bytes_are_a_miss_and_an_error_metric(kvstores):
    run = await kvstores.start()
    hashes, data = chain(3), block_bytes(3)
    await run.peer.ask(put_msg(hashes, data))
    rec = run.actor.store.index.record(unpack(hashes)[1])
    with open(segment_path(kvstores.store_dir, rec.segment), "r+b") as f:
        f.seek(rec.offset + 7)
        f.write(b"\x00\xff\x00")
    read = await run.peer.ask(GetBlocks(unpack(hashes)))
    assert read.found == [True, False, True]
    stats = await run.peer.ask(GetStats())
    assert stats.corrupt == 1 and stats.blocks == 2
    assert (await run.peer.ask(MatchPrefix(unpack(hashes)))).hit_blocks == 1


async def test_ttl_classes_and_sweep(kvstores, clock):
    run = await kvstores.start(ttl_agent_s=100.0, ttl_chatbot_s=200.0)
    agent, chat = chain(2, seed=1), chain(2, seed=2)
    await run.peer.ask(put_msg(agent, block_bytes(2), "agent"))
    await run.peer.ask(put_msg(chat, block_bytes(2), "chatbot"))
    clock.t += 150
    await run.actor.sweep()
    assert (await run.peer.ask(GetStats())).expired == 2
    assert (await run.peer.ask(MatchPrefix(unpack(agent)))).hit_blocks == 0
    assert (await run.peer.ask(MatchPrefix(unpack(chat)))).hit_blocks == 2
    info = await run.peer.ask(GetIndexInfo())
    assert info.blocks == 2 and info.publish.startswith("tcp://127.0.0.1:")


async def test_many_reads_at_once_stay_bounded(kvstores):
    run = await kvstores.start(read_workers=2, max_inflight_reads=8)
    hashes, data = chain(64), block_bytes(64)
    await run.peer.ask(put_msg(hashes, data))
    calls = [run.peer.ask(GetBlocks(unpack(hashes)[i::4])) for i in range(4)]
    reads = await asyncio.gather(*calls)
    assert all(all(r.found) and len(r.found) == 16 for r in reads)
    assert run.actor._reads.in_flight == 0
