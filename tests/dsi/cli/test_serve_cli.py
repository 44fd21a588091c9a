"""dsi serve as a real process tree: a whole local cluster, its status, and no orphans."""

import json
import os
import signal
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

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


def replaced(config, role_id: str, old_pid: int, roles: int):
    """The instances once `role_id` runs under a pid other than `old_pid` and all `roles` are ready."""
    listed = instances("--config", str(config))
    ready = [info for info in listed.values() if info["state"] == "serving"]
    fresh = role_id in listed and listed[role_id]["pid"] != old_pid and listed[role_id]["state"] == "serving"
    return listed if fresh and len(ready) == roles else None


def test_serve_replaces_killed_roles_while_the_gateway_keeps_serving(procs, tmp_path):
    config = local_config(tmp_path)
    port = free_port()
    server, banner = serve(procs, config, "--port", str(port))
    ids = config_ids(config)
    assert banner == f"dsi serve: gateway http://127.0.0.1:{port} ({len(ids)} instances)"
    listed = instances("--config", str(config))
    assert sorted(listed) == sorted(ids)
    assert {info["state"] for info in listed.values()} == {"serving"}
    assert listed["entrypoint-0"]["http"] == f"127.0.0.1:{port}"
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as resp:
        assert json.load(resp)["status"] == "ok"
    pids = {iid: info["pid"] for iid, info in listed.items()}
    procs.adopt(pids.values())
    assert len(set(pids.values())) == len(ids) and server.pid not in pids.values()

    # A decode dies under 16 streams: they and new requests are answered while it is replaced.
    with ThreadPoolExecutor(16) as pool:
        streams = [pool.submit(chat, port, 64, True) for _ in range(16)]
        # Killed once streams run there: a decode whose connection dropped gets no new requests.
        wait_until(lambda: instances("--config", str(config))["decode-0"]["load"]["running"] > 0, every=0.1)
        os.kill(pids["decode-0"], signal.SIGKILL)
        answered = 0
        deadline = time.monotonic() + 30
        while True:  # at least one request right after the kill, then more until the replacement is in
            assert chat(port)["choices"][0]["finish_reason"] in ("length", "stop")
            answered += 1
            if (after := replaced(config, "decode-0", pids["decode-0"], len(ids))) is not None:
                break
            assert time.monotonic() < deadline, "decode-0 was not replaced within 30s"
        for done in streams:
            sse = done.result()
            assert sse.rstrip().endswith("data: [DONE]") and '"error"' not in sse
    assert answered >= 1
    assert "peer_lost on decode-0" in server.log()  # some streams were on it, and were re-run
    procs.adopt([after["decode-0"]["pid"]])
    assert server.popen.poll() is None
    assert {iid: info["pid"] for iid, info in after.items() if iid != "decode-0"} == {
        iid: pid for iid, pid in pids.items() if iid != "decode-0"
    }
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as resp:
        assert json.load(resp)["instances"] == 2
    assert "decode-0: ready -> backoff (pid" in server.log()

    # The controller dies: its replacement learns every instance again from their heartbeats.
    os.kill(pids["controller-0"], signal.SIGKILL)
    final = wait_until(lambda: replaced(config, "controller-0", pids["controller-0"], len(ids)), timeout=30)
    procs.adopt([final["controller-0"]["pid"]])
    assert chat(port)["usage"]["completion_tokens"] > 0

    server.signal(signal.SIGINT)
    assert server.wait(60) == 0
    every = {*pids.values(), *(info["pid"] for info in final.values())}
    assert len(every) == len(ids) + 2
    wait_until(lambda: all(gone(pid) for pid in every), timeout=10)


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
