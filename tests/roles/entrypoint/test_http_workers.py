"""An entrypoint role with ``http_workers = 2``: two processes answer on one HTTP port, each
naming itself, and stopping the role stops both."""

import asyncio
import os
import signal
import socket

import aiohttp

from dsi.config import parse_config
from dsi.roles.host import RoleHost
from dsi.transport.ports import free_port


def two_worker_entrypoint(tmp_path) -> tuple[int, RoleHost]:
    """(HTTP port, a not yet started host of a controller and an entrypoint of 2 HTTP workers)."""
    controller, bind, http = free_port(), free_port(), free_port()
    cfg = parse_config(
        {
            "cluster": {"controller": f"tcp://127.0.0.1:{controller}"},
            "roles": [
                {"kind": "controller", "id": "controller-0", "bind": f"tcp://127.0.0.1:{controller}"},
                {"kind": "entrypoint", "id": "entrypoint-0", "bind": f"tcp://127.0.0.1:{bind}",
                 "http": f"127.0.0.1:{http}", "http_workers": 2},
            ],
        },
        tmp_path / "node.toml",
    )  # fmt: skip
    host = RoleHost(cfg, ["controller-0", "entrypoint-0"])
    return http, host


async def test_two_workers_share_the_port_and_stop_with_the_role(tmp_path):
    http, host = two_worker_entrypoint(tmp_path)
    await host.start()
    try:
        workers = host.servers["entrypoint-0"].actor.workers
        assert workers is not None and workers.names == ["entrypoint-0.w1"]
        pids = workers.pids
        seen: dict[str, dict] = {}
        # A new connection per request, so the kernel may hand each to either listener.
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            for _ in range(200):
                async with session.get(f"http://127.0.0.1:{http}/health") as resp:
                    # No decode instance is registered: each worker says so (503) in its own name.
                    assert resp.status == 503
                    body = await resp.json()
                    seen[resp.headers["X-Dsi-Worker"]] = body
                if len(seen) == 2:
                    break
        assert set(seen) == {"entrypoint-0", "entrypoint-0.w1"}
        assert {body["worker"] for body in seen.values()} == set(seen)
    finally:
        await host.stop()
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}"), f"worker {pid} still running"
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", http)) != 0  # nobody listens on the port any more


async def test_a_killed_worker_is_started_again_and_serves(tmp_path):
    http, host = two_worker_entrypoint(tmp_path)
    await host.start()
    try:
        workers = host.servers["entrypoint-0"].actor.workers
        assert workers is not None
        [first] = workers.pids
        os.kill(first, signal.SIGKILL)
        for _ in range(1200):  # the restart loads the recipe again: seconds on a busy machine
            if workers.restarts == 1:
                break
            await asyncio.sleep(0.1)
        assert workers.restarts == 1
        [second] = workers.pids
        assert second != first and os.path.exists(f"/proc/{second}")
        seen: set[str] = set()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            for _ in range(200):
                async with session.get(f"http://127.0.0.1:{http}/health") as resp:
                    seen.add(resp.headers["X-Dsi-Worker"])
                if len(seen) == 2:
                    break
        assert seen == {"entrypoint-0", "entrypoint-0.w1"}
    finally:
        await host.stop()
    assert not os.path.exists(f"/proc/{second}"), f"worker {second} still running"
