"""dsi serve as a real process tree: a whole local cluster, its status, and no orphans."""

import json
import os
import signal
import urllib.request

import pytest

from tests.dsi.cli.procs import (
    Procs,
    config_ids,
    free_port,
    gone,
    instances,
    local_config,
    python_module,
    wait_until,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def procs(tmp_path):
    with Procs(tmp_path) as group:
        yield group


def serve(procs: Procs, config, *extra: str):
    proc = procs.start("serve", python_module("dsi.cli.main", "serve", "--config", str(config), *extra))
    return proc, proc.read_line()


def test_serve_runs_every_role_and_stops_all_when_one_dies(procs, tmp_path):
    config = local_config(tmp_path)
    port = free_port()
    server, banner = serve(procs, config, "--port", str(port))
    ids = config_ids(config)
    assert banner == f"dsi serve: gateway http://127.0.0.1:{port} ({len(ids)} instances)"
    listed = instances("--config", str(config))
    assert sorted(listed) == sorted(ids)
    assert {info["state"] for info in listed.values()} == {"ready"}
    assert listed["entrypoint-0"]["http"] == f"127.0.0.1:{port}"
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as resp:
        assert json.load(resp)["status"] == "ok"
    pids = {iid: info["pid"] for iid, info in listed.items()}
    procs.adopt(pids.values())
    assert len(set(pids.values())) == len(ids) and server.pid not in pids.values()

    victim = pids["prefill-1"]
    os.kill(victim, signal.SIGKILL)
    assert server.wait(60) != 0
    assert "prefill-1" in server.log() and "exited" in server.log()
    wait_until(lambda: all(gone(pid) for pid in pids.values()), timeout=10)


def test_sigterm_stops_every_role_and_exits_0(procs, tmp_path):
    config = local_config(tmp_path, keep=["controller-0", "prefill-0"])
    server, banner = serve(procs, config)
    assert banner.startswith("dsi serve: gateway none") and banner.endswith("(2 instances)")
    pids = [info["pid"] for info in instances("--config", str(config)).values()]
    procs.adopt(pids)
    server.signal(signal.SIGTERM)
    assert server.wait(60) == 0
    assert all(gone(pid) for pid in pids)


def test_roles_die_with_a_killed_serve(procs, tmp_path):
    config = local_config(tmp_path, keep=["controller-0", "prefill-0"])
    server, _ = serve(procs, config)
    pids = [info["pid"] for info in instances("--config", str(config)).values()]
    procs.adopt(pids)
    server.signal(signal.SIGKILL)  # no chance to stop anyone: the kernel tells the children
    server.wait(10)
    wait_until(lambda: all(gone(pid) for pid in pids), timeout=15)
