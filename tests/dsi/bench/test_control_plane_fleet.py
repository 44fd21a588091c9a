"""``dsi bench control-plane``'s simulated instances: many identities in one process, each with
its own heartbeat socket, registered by a real controller and reporting load to a balancer.
Outcomes only, never timing."""

from __future__ import annotations

import asyncio
import time

import pytest
import zmq.asyncio

from dsi.actor import handles
from dsi.bench.control_plane_fleet import Fleet, FleetSpec, fleet_ids, split
from dsi.config import ClusterConfig
from dsi.messages import ALL
from dsi.messages.balancer import LoadReport
from dsi.messages.control import InstanceTable, ListInstances
from dsi.roles.controller import ControllerActor
from dsi.roles.role import RoleActor
from dsi.transport.client import Peer
from dsi.transport.server import ActorServer

N = 30
INTERVAL_S = 0.2


class RecordingBalancer(RoleActor):
    """Keeps the last LoadReport of each instance."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.reports: dict[str, LoadReport] = {}

    @handles
    def load_report(self, msg: LoadReport) -> None:
        self.reports[msg.instance_id] = msg


def test_fleet_ids_name_the_prefills_first_and_split_deals_them_round_robin():
    ids = fleet_ids(5, prefill_share=0.4)
    assert ids == [
        ("prefill-0000", "prefill"),
        ("prefill-0001", "prefill"),
        ("decode-0002", "decode"),
        ("decode-0003", "decode"),
        ("decode-0004", "decode"),
    ]
    groups = split(ids, 2)
    assert [len(g) for g in groups] == [3, 2] and sorted(sum(groups, ())) == sorted(ids)
    assert len(split(ids, 9)) == 5  # never an empty group
    with pytest.raises(ValueError, match="prefill or a decode"):
        FleetSpec("tcp://127.0.0.1:1", (), (("encoder-0", "encoder"),))


async def _wait(predicate, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_every_simulated_instance_registers_serves_reports_load_and_says_goodbye():
    ctx = zmq.asyncio.Context()
    cluster = ClusterConfig(
        controller="tcp://127.0.0.1:1", heartbeat_interval_s=INTERVAL_S, heartbeat_timeout_s=5.0
    )
    controller = ActorServer(ControllerActor("controller-0", cluster), "tcp://127.0.0.1:*", ctx)
    recorder = RecordingBalancer("balancer-0")
    balancer = ActorServer(recorder, "tcp://127.0.0.1:*", ctx)
    await controller.start()
    await balancer.start()
    ids = fleet_ids(N)
    fleet = Fleet(FleetSpec(controller.address, (balancer.address,), tuple(ids), INTERVAL_S))
    peer = Peer(controller.address, ctx, types=ALL, timeout=5.0)
    try:
        await fleet.start()
        await peer.connect()
        tables: list[InstanceTable] = []

        async def listed() -> dict[str, str]:
            tables.append(await peer.ask(ListInstances()))
            return {i.instance_id: i.state for i in tables[-1].instances}

        deadline = time.monotonic() + 20.0
        while (states := await listed()) != {iid: "serving" for iid, _ in ids}:
            assert time.monotonic() < deadline, states
            await asyncio.sleep(0.05)
        [info] = [i for i in tables[-1].instances if i.instance_id == "decode-0029"]
        assert (info.role, info.address) == ("decode", fleet.address)  # each advertises the fleet's server
        assert len({i.pid for i in tables[-1].instances}) == 1  # one process, N identities
        await _wait(lambda: len(recorder.reports) == N)
        assert {r.role for r in recorder.reports.values()} == {"prefill", "decode"}
        assert all(r.max_requests > 0 for r in recorder.reports.values() if r.role == "decode")
        # Each identity beats on its own: the Assignment it got comes back in its next heartbeat.
        await _wait(lambda: all(s.assigned == "serving" for s in fleet.senders))
        assert fleet.heartbeats_sent >= 2 * N
        # A gateway's connection to an instance reaches the fleet's server.
        gateway = Peer(info.address, ctx, types=ALL, timeout=5.0)
        try:
            assert (await gateway.connect()).peer_id.startswith("fleet-")
        finally:
            await gateway.close()
        await fleet.stop()
        assert set((await listed()).values()) == {"stopped"}
    finally:
        await peer.close()
        await fleet.stop()
        await balancer.stop()
        await controller.stop()
        ctx.destroy(linger=0)
