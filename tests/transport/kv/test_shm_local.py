"""shm is same-host only: a sender that cannot map the receiver's /dev/shm slab (as on another
host) fails with TransferFailed before writing a byte, and the receiver's claimed region is freed."""

from __future__ import annotations

import msgspec
import pytest

from dsi.errors import TransferFailed
from dsi.transport.kv import KvTarget, wire
from tests.transport.kv.planes import plane_pair


async def test_a_sender_elsewhere_cannot_write_into_shm():
    async with plane_pair("shm") as (receiver, sender):
        inbound = receiver.expect("far", 4096, 30.0)
        name, offset = msgspec.msgpack.decode(inbound.target.region)
        elsewhere = wire.encode([name + "-on-another-host", offset])  # a file this host does not have
        target = KvTarget("shm", inbound.target.address, "far", 4096, elsewhere)
        with pytest.raises(TransferFailed, match="cannot be mapped"):
            await sender.send(target, [b"\x01" * 4096], 30.0)
        with pytest.raises(TransferFailed, match="aborted"):
            await inbound.wait()
        assert receiver.stats.transfers_in == 0 and receiver.stats.regions_live == 0
