"""dsi serve as a real process tree: a whole local cluster, its status, and no orphans."""

import json
import signal
import urllib.request

import pytest

from tests.dsi.cli.procs import (
    Procs,
    config_ids,
    dsi_status,
    free_port,
    gone,
    instances,
    local_config,
    parent_pid,
    python_module,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.concurrent]


def serve(procs: Procs, config, *extra: str):
    proc = procs.start("serve", python_module("dsi.cli.main", "serve", "--config", str(config), *extra))
    return proc, proc.read_line()


def chat(port: int, max_tokens: int = 4, stream: bool = False) -> dict | str:
    """A chat completion: the JSON answer, or with `stream` the whole SSE text."""
    body = {
        "model": "dsi-tiny",
        "max_tokens": max_tokens,
        "stream": stream,
        "messages": [{"role": "user", "content": "Hello"}],
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        assert resp.status == 200
        return resp.read().decode() if stream else json.load(resp)


def test_serve_starts_every_role_serving_and_sigint_stops_them_all(procs, tmp_path):
    """Start-up and Ctrl-C. Kills under `dsi serve` (every role kind, with the streams compared to
    an undisturbed run) are in test_serve_failover.py."""
    config = local_config(tmp_path)
    port = free_port()
    server, banner = serve(procs, config, "--port", str(port))
    ids = config_ids(config)
    assert banner == f"dsi serve: gateway http://127.0.0.1:{port} ({len(ids)} instances)"
    listed = instances("--config", str(config))
    assert sorted(listed) == sorted(ids)
    assert {info["state"] for info in listed.values()} == {"serving"}
    assert listed["entrypoint-0"]["http"] == f"127.0.0.1:{port}"
    # every engine reports its machine fingerprint: one machine, one config, one digest
    engines = [info for info in listed.values() if info["role"] in ("prefill", "decode")]
    assert engines and len({info["fingerprint"]["digest"] for info in engines}) == 1
    assert all(info["fingerprint"] is None for info in listed.values() if info not in engines)
    text = dsi_status("--config", str(config)).stdout
    assert text.splitlines()[0].endswith("FINGERPRINT") and "warning" not in text
    assert json.loads(dsi_status("--json", "--config", str(config)).stdout)["warnings"] == []
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as resp:
        assert json.load(resp)["status"] == "ok"
    pids = {iid: info["pid"] for iid, info in listed.items()}
    procs.adopt(pids.values())
    assert len(set(pids.values())) == len(ids) and server.pid not in pids.values()
    # engine roles are forked by serve's fork server, the others started by serve itself
    [forked_server] = {parent_pid(info["pid"]) for info in engines}
    assert forked_server != server.pid and parent_pid(forked_server) == server.pid
    assert {parent_pid(info["pid"]) for info in listed.values() if info not in engines} == {server.pid}
    assert chat(port)["usage"]["completion_tokens"] > 0

    server.signal(signal.SIGINT)
    assert server.wait(60) == 0
    wait_until(lambda: all(gone(pid) for pid in [*pids.values(), forked_server]), timeout=10)


def test_sigterm_stops_every_role_and_exits_0(procs, tmp_path):
    config = local_config(tmp_path, keep=["controller-0", "prefill-0"])
    server, banner = serve(procs, config, "--no-fork-server")
    assert banner.startswith("dsi serve: gateway none") and banner.endswith("(2 instances)")
    pids = [info["pid"] for info in instances("--config", str(config)).values()]
    procs.adopt(pids)
    assert {parent_pid(pid) for pid in pids} == {server.pid}  # the prefill too: no fork server
    server.signal(signal.SIGTERM)
    assert server.wait(60) == 0
    assert all(gone(pid) for pid in pids)


def test_roles_die_with_a_killed_serve(procs, tmp_path):
    config = local_config(tmp_path, keep=["controller-0", "prefill-0"])
    server, _ = serve(procs, config)
    pids = [info["pid"] for info in instances("--config", str(config)).values()]
    pids.append(parent_pid(instances("--config", str(config))["prefill-0"]["pid"]))  # the fork server
    procs.adopt(pids)
    server.signal(signal.SIGKILL)  # no chance to stop anyone: the kernel tells the children
    server.wait(10)
    wait_until(lambda: all(gone(pid) for pid in pids), timeout=15)
