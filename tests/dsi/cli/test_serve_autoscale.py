"""dsi serve with configs/autoscale.toml: a load ramp scales decode 1 -> 3 and back to 1.

The test copy keeps the controller, the gateway and the four declared decode instances (no
prefill, no kvstore: the gateway runs each request on a decode), with a 0.5 s heartbeat and a
1 s decision interval, so the ramp fits in CI.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from dsi.cli.main import main
from dsi.cli.scale_view import ask_scale
from dsi.cli.status import fetch_instances
from dsi.config import load_config
from dsi.messages.control import GetScale, InstanceTable, ScaleRole, ScaleStatus
from tests.dsi.cli.procs import (
    REPO_ROOT,
    Procs,
    dsi_status,
    free_port,
    local_config,
    python_module,
    wait_until,
)

AUTOSCALE_TOML = REPO_ROOT / "configs" / "autoscale.toml"
KEEP = ("controller-0", "entrypoint-0", "decode-0", "decode-1", "decode-2", "decode-3", "decode-4")
ENDED = ("stopped", "dead")  # their pids may belong to other processes by now
STREAMS = 4  # 4 (or 5) active requests at 2 per instance need 3 decode instances


def autoscale_config(tmp_path: Path) -> Path:
    path = local_config(tmp_path, keep=KEEP, source=AUTOSCALE_TOML)
    text = re.sub(r"(?m)^interval_s = .*$", "interval_s = 1.0", path.read_text())
    text = re.sub(r"(?m)^drain_timeout_s = .*$", "drain_timeout_s = 20.0", text)
    path.write_text(text)
    return path


def status(config: Path) -> dict[str, Any]:
    done = dsi_status("--config", str(config), "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def controller_now(config: Path) -> tuple[InstanceTable, ScaleStatus]:
    """The instances and the autoscaler's state, asked in this process (cheaper than `dsi status`)."""
    address = load_config(config).cluster.controller
    return asyncio.run(fetch_instances(address, None, 10.0)), asyncio.run(
        ask_scale(address, None, 10.0, GetScale())
    )


def decode_now(config: Path) -> ScaleRole:
    [role] = [r for r in controller_now(config)[1].roles if r.role == "decode"]
    return role


@contextmanager
def load(port: int, streams: int) -> Iterator[None]:
    """`streams` clients, each streaming one chat completion after another until the block ends."""
    stop = threading.Event()

    def client(i: int) -> None:
        body = json.dumps(
            {
                "model": "dsi-tiny",
                "max_tokens": 48,
                "stream": True,
                "messages": [{"role": "user", "content": f"count to ten, client {i}"}],
            }
        )
        while not stop.is_set():
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            try:
                conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                while not stop.is_set() and resp.readline():
                    pass
            except OSError:
                pass
            finally:
                conn.close()  # mid-stream when stopped: the gateway cancels the request

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(streams)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(70)


def test_serve_refuses_a_scale_past_the_declared_instances(tmp_path: Path, capsys):
    config = local_config(tmp_path, keep=KEEP[:-1], source=AUTOSCALE_TOML)  # decode-0..3 for a max of 5
    assert main(["serve", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dsi serve: ") and err.endswith(
        "autoscale.decode.max_instances: 5 decode instances may run, but the config declares 4 [[roles]] "
        "of kind 'decode'\n"
    )


@pytest.mark.slow
def test_a_load_ramp_scales_decode_from_1_to_3_and_back(procs: Procs, tmp_path: Path):
    config = autoscale_config(tmp_path)
    port = free_port()
    server = procs.start(
        "serve", python_module("dsi.cli.main", "serve", "--config", str(config), "--port", str(port))
    )
    assert server.read_line() == f"dsi serve: gateway http://127.0.0.1:{port} (4 instances)"
    table, _ = controller_now(config)
    procs.adopt(info.pid for info in table.instances if info.state not in ENDED)
    # decode-0 and decode-1 started: the first one registered serves, the other waits in the pool.
    decodes = {i.instance_id: i.state for i in table.instances if i.role == "decode"}
    assert sorted(decodes) == ["decode-0", "decode-1"] and sorted(decodes.values()) == ["ready", "serving"]
    role = decode_now(config)
    assert (role.serving, role.ready, role.wanted, role.max_instances) == (1, 1, 2, 5)

    with load(port, STREAMS):
        wait_until(lambda: decode_now(config).serving == 3, timeout=120, every=1.0)
        table, up = controller_now(config)
        procs.adopt(info.pid for info in table.instances if info.state not in ENDED)
    wait_until(
        lambda: (role := decode_now(config)).serving == 1 and role.draining == 0, timeout=120, every=1.0
    )
    down = status(config)
    procs.adopt(info["pid"] for info in down["instances"] if info["state"] not in ENDED)

    decisions = [d for d in down["autoscale"]["decisions"] if d["role"] == "decode"]
    targets = [d["target"] for d in decisions]
    assert 3 in targets and targets[-1] == 1
    # The rate limit: never more than one instance from the serving count per decision.
    assert all(abs(d["target"] - d["serving"]) <= 1 for d in decisions)
    # The ready pool served the burst first: the first scale-up took a ready instance and
    # started one to refill the pool.
    first_up = next(d for d in up.decisions if d.role == "decode" and d.target > d.serving >= 1)
    assert (first_up.serving, first_up.ready, first_up.take, first_up.start) == (1, 1, 1, 1)
    assert first_up.demand >= 2  # active requests the decode instances reported (2 per instance)
    # Instances beyond min + pool were stopped by serve once drained.
    live = {i["instance_id"]: i["state"] for i in down["instances"] if i["role"] == "decode"}
    assert sorted(s for s in live.values() if s in ("serving", "ready")) == ["ready", "serving"]
    assert "stopped" in live.values()
