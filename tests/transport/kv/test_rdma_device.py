"""The rdma backend on a real device (pyverbs). Skipped where ``ibv_get_device_list`` is empty."""

from __future__ import annotations

import numpy as np
import pytest

from dsi.transport.kv import make_data_plane
from dsi.transport.kv.rdma.pyverbs_device import device_names, open_device

pytestmark = [
    pytest.mark.rdma,
    pytest.mark.skipif(
        not device_names(),
        reason="no RDMA device: ibv_get_device_list is empty "
        "(or rdma-core's python3-pyverbs is not installed)",
    ),
]


async def test_64_mib_round_trip_on_the_device():
    data = np.random.default_rng(7).integers(0, 256, 64 << 20, dtype=np.uint8)
    receiver = make_data_plane("rdma", verbs=open_device())
    sender = make_data_plane("rdma", verbs=open_device())
    await receiver.start()
    await sender.start()
    try:
        inbound = receiver.expect("hw", data.nbytes, 30.0)
        await sender.send(inbound.target, [data[: 1 << 20], data[1 << 20 :]], 30.0)
        assert bytes(await inbound.wait()) == data.tobytes()
        inbound.release()
    finally:
        await sender.close()
        await receiver.close()
