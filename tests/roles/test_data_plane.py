"""A role's data plane (dsi.roles.data_plane) over real sockets on 127.0.0.1: targets name the told
host, and the EngineStats fields it reports are its told endpoint and, keyed, its link counters (a
sender without the keys counts as refused, one with them as accepted)."""

from __future__ import annotations

import pytest

from dsi.config import RoleAddresses
from dsi.errors import TransferFailed, TransferTimeout
from dsi.roles.data_plane import data_plane_stats, start_data_plane
from dsi.transport.kv import KvTarget, make_data_plane
from dsi.transport.security import CurveKeys
from tests.transport.kv.keys import key_set, node_keys

TOLD = RoleAddresses("127.0.0.1", "localhost")  # bound on loopback, told by name


async def push(address: str, keys: CurveKeys | None, timeout_s: float = 0.5) -> None:
    sender = make_data_plane("tcp", keys=keys)  # sends only: never started
    try:
        await sender.send(KvTarget("tcp", address, "no-such-lease", 16), [bytes(16)], timeout_s)
    finally:
        await sender.close()


async def test_keyed_link_counters_and_the_told_endpoint(tmp_path):
    keys = node_keys(key_set(tmp_path / "keys"))
    plane = await start_data_plane("tcp", TOLD, keys=keys)
    try:
        port = plane.address.rsplit(":", 1)[1]
        assert plane.address == f"tcp://localhost:{port}"
        assert plane.expect("t", 8, 5.0).target.address == plane.address
        bound = f"tcp://127.0.0.1:{port}"
        with pytest.raises(TransferTimeout):
            await push(bound, None)  # no keys: not even a refusal comes back
        with pytest.raises(TransferFailed, match="unknown or expired transfer id"):
            await push(bound, keys, timeout_s=5.0)  # with them: the receiver answers
        assert data_plane_stats(plane) == {
            "data_address": plane.address,
            "links_accepted": 1,
            "links_refused": 2,  # the clear sender's chunk, then its abort
            "links_rejected": 0,
        }
    finally:
        await plane.close()


async def test_a_clear_plane_reports_its_endpoint_only():
    plane = await start_data_plane("tcp", TOLD)
    try:
        assert data_plane_stats(plane) == {"data_address": plane.address}
    finally:
        await plane.close()
    assert data_plane_stats(None) == {}
