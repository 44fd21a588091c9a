"""RoleHost in this process: real sockets on 127.0.0.1, a fast heartbeat."""

import asyncio
import socket

import aiohttp
import pytest
import zmq.asyncio

from dsi.config import NodeConfig, parse_config
from dsi.engine import machine_fingerprint
from dsi.errors import DsiError
from dsi.messages.control import InstanceTable, ListInstances, Load
from dsi.roles.host import RoleHost, RoleStartError
from dsi.transport.client import Peer
from dsi.transport.ports import free_port

INTERVAL = 0.1


def node_config(tmp_path) -> NodeConfig:
    ports = [free_port() for _ in range(4)]
    data = {
        "cluster": {
            "controller": f"tcp://127.0.0.1:{ports[0]}",
            "heartbeat_interval_s": INTERVAL,
            "heartbeat_timeout_s": 1.0,
        },
        "roles": [
            {"kind": "controller", "id": "controller-0", "bind": f"tcp://127.0.0.1:{ports[0]}"},
            {"kind": "prefill", "id": "prefill-0", "bind": f"tcp://127.0.0.1:{ports[1]}"},
            {
                "kind": "entrypoint",
                "id": "entrypoint-0",
                "bind": f"tcp://127.0.0.1:{ports[2]}",
                "http": f"127.0.0.1:{ports[3]}",
            },
        ],
    }
    return parse_config(data, tmp_path / "node.toml")


@pytest.fixture
async def controller_peer(tmp_path):
    ctx = zmq.asyncio.Context()
    cfg = node_config(tmp_path)
    peer = Peer(cfg.cluster.controller, ctx, types=(InstanceTable, Load), timeout=2.0)
    yield cfg, peer
    await peer.close()
    ctx.destroy(linger=0)


async def states(peer: Peer) -> dict[str, str]:
    table = await peer.ask(ListInstances())
    return {info.instance_id: info.state for info in table.instances}


async def wait_for(peer: Peer, expected: dict[str, str], timeout: float = 5.0) -> None:
    """Poll the controller until it lists `expected`; a controller restart fails polls meanwhile."""
    deadline = asyncio.get_running_loop().time() + timeout
    got: dict[str, str] | DsiError = {}
    while asyncio.get_running_loop().time() < deadline:
        try:
            got = await states(peer)
        except DsiError as exc:  # PeerLost while the controller restarts
            got = exc
        if got == expected:
            return
        await asyncio.sleep(INTERVAL / 2)
    pytest.fail(f"controller lists {got!r}, expected {expected}")


async def test_roles_register_serve_and_say_goodbye(controller_peer):
    cfg, peer = controller_peer
    control = RoleHost(cfg, ["controller-0"])
    workers = RoleHost(cfg, ["entrypoint-0", "prefill-0"])
    await control.start()
    try:
        await workers.start()
        try:
            await peer.connect()
            await wait_for(
                peer, {"controller-0": "serving", "entrypoint-0": "serving", "prefill-0": "serving"}
            )
            table = await peer.ask(ListInstances("entrypoint"))
            [gateway] = table.instances
            async with aiohttp.ClientSession() as http, http.get(f"http://{gateway.http}/health") as resp:
                health = (
                    await resp.json()
                )  # the gateway serves HTTP; with no decode role it cannot serve a request
                assert (
                    resp.status == 503 and health["status"] == "unavailable" and "decode" in health["reason"]
                )
            assert workers.heartbeats["prefill-0"].sent >= 1
            # an engine's heartbeats carry its machine fingerprint (this process's); others none
            fingerprints = {i.instance_id: i.fingerprint for i in (await peer.ask(ListInstances())).instances}
            assert fingerprints == {
                "controller-0": None,
                "entrypoint-0": None,
                "prefill-0": machine_fingerprint(),
            }
        finally:
            await workers.stop()
        await wait_for(peer, {"controller-0": "serving", "entrypoint-0": "stopped", "prefill-0": "stopped"})
    finally:
        await control.stop()


async def test_a_started_controller_already_lists_itself(controller_peer):
    """start() (a role process's READY) returns once the controller answered its own first
    heartbeat, so `dsi status` right after READY lists it."""
    cfg, peer = controller_peer
    control = RoleHost(cfg, ["controller-0"])
    await control.start()
    try:
        assert control.heartbeats["controller-0"].answered.is_set()
        await peer.connect()
        assert await states(peer) == {"controller-0": "serving"}
    finally:
        await control.stop()


async def test_heartbeats_reach_a_restarted_controller(controller_peer):
    cfg, peer = controller_peer
    workers = RoleHost(cfg, ["prefill-0"])
    control = RoleHost(cfg, ["controller-0"])
    await workers.start()  # before the controller: heartbeats wait in the socket
    try:
        await control.start()
        await peer.connect()
        await wait_for(peer, {"controller-0": "serving", "prefill-0": "serving"})
        await control.stop()
        control = RoleHost(cfg, ["controller-0"])
        await control.start()  # a fresh registry on the same address
        await wait_for(peer, {"controller-0": "serving", "prefill-0": "serving"})
    finally:
        await workers.stop()
        await control.stop()


async def test_a_role_that_cannot_bind_stops_the_others(controller_peer):
    cfg, _ = controller_peer
    port = int(cfg.role("prefill-0").bind.rsplit(":", 1)[1])
    with socket.create_server(("127.0.0.1", port)):  # someone else holds prefill-0's port
        clash = RoleHost(cfg, ["controller-0", "prefill-0"])
        with pytest.raises(RoleStartError, match="prefill-0: cannot bind"):
            await clash.start()
        assert clash.servers == {}
    again = RoleHost(cfg, ["controller-0"])  # the controller's port was released
    await again.start()
    await again.stop()


async def test_a_role_registers_with_the_host_the_address_rule_tells(tmp_path):
    """``host`` set: the controller lists it as the role's host, in its address and its HTTP
    address (both bound where the role binds), and the gateway answers there."""
    ports = [free_port() for _ in range(3)]
    controller = f"tcp://127.0.0.1:{ports[0]}"
    data = {
        "cluster": {"controller": controller, "heartbeat_interval_s": INTERVAL, "heartbeat_timeout_s": 1.0},
        "roles": [
            {"kind": "controller", "id": "controller-0", "bind": controller},
            {
                "kind": "entrypoint",
                "id": "entrypoint-0",
                "bind": f"tcp://127.0.0.1:{ports[1]}",
                "host": "localhost",
                "http": f"127.0.0.1:{ports[2]}",
            },
        ],
    }
    host = RoleHost(parse_config(data, tmp_path / "node.toml"), ["controller-0", "entrypoint-0"])
    ctx = zmq.asyncio.Context()
    peer = Peer(controller, ctx, types=(InstanceTable, Load), timeout=2.0)
    await host.start()
    try:
        await peer.connect()
        await wait_for(peer, {"controller-0": "serving", "entrypoint-0": "serving"})
        [gateway] = (await peer.ask(ListInstances("entrypoint"))).instances
        assert (gateway.host, gateway.address) == ("localhost", f"tcp://localhost:{ports[1]}")
        assert gateway.http == f"localhost:{ports[2]}"
        async with aiohttp.ClientSession() as http, http.get(f"http://{gateway.http}/health") as resp:
            assert resp.status == 503  # served (no decode role, so unavailable)
    finally:
        await peer.close()
        await host.stop()
        ctx.destroy(linger=0)
