"""A kvstore as a real ``dsi-role`` process: blocks and a CHECK replica survive SIGTERM + restart."""

import asyncio
import re
import signal

import pytest
import zmq.asyncio

from dsi.errors import PeerLost
from dsi.kvcache.hashchain import unpack
from dsi.kvcache.replica import CheckReplica
from dsi.messages import ALL
from dsi.messages.kvstore import GetBlocks, GetIndexInfo, MatchPrefix
from dsi.transport.client import Peer
from tests.dsi.cli.procs import Procs, local_config, python_module
from tests.roles.kvstore.conftest import block_bytes, chain, put_msg

pytestmark = [pytest.mark.slow, pytest.mark.concurrent]


def start_kvstore(procs: Procs, config):
    proc = procs.start(
        "kvstore-0", python_module("dsi.cli.role", "--config", str(config), "--role", "kvstore-0")
    )
    assert proc.wait_ready() == "READY kvstore-0"
    return proc


async def ask_after_restart(peer: Peer, msg, tries: int = 20):
    """The peer may hear of the old connection's loss after the new process is READY."""
    for _ in range(tries - 1):
        try:
            return await peer.ask(msg)
        except PeerLost:
            await asyncio.sleep(0.1)
    return await peer.ask(msg)


async def test_blocks_and_the_replica_survive_a_kvstore_restart(procs, tmp_path):
    config = local_config(tmp_path, keep=["controller-0", "kvstore-0"])
    address = re.search(r'id = "kvstore-0"\nbind = "([^"]+)"', config.read_text()).group(1)
    proc = start_kvstore(procs, config)
    ctx = zmq.asyncio.Context()
    peer = Peer(address, ctx, types=ALL, timeout=20)
    replica = CheckReplica(address, ctx, silence_s=1.0, timeout=20)
    try:
        await peer.connect()
        await replica.start()
        hashes, data = chain(12), block_bytes(12)
        await peer.ask(put_msg(hashes, data, "agent"))
        info = await peer.ask(GetIndexInfo())
        await replica.wait_seq(info.epoch, info.seq)
        assert replica.match(hashes) == 12

        proc.signal(signal.SIGTERM)
        assert proc.wait() == 0
        start_kvstore(procs, config)
        assert (await ask_after_restart(peer, MatchPrefix(unpack(hashes)))).hit_blocks == 12
        read = await peer.ask(GetBlocks(unpack(hashes)))
        assert [bytes(b.buffer) for b in read.data] == data
        info = await peer.ask(GetIndexInfo())
        await replica.wait_seq(info.epoch, info.seq, timeout=20)  # resynced to the new epoch
        assert replica.match(hashes) == 12
    finally:
        await replica.stop()
        await peer.close()
        ctx.destroy(linger=0)
