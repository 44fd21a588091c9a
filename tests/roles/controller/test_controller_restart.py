"""Controller state is soft: a restarted controller process rebuilds its table from heartbeats."""

import asyncio
import json
import time

from dsi.cli.status import fetch_instances
from dsi.config import load_config
from tests.dsi.cli.procs import Procs, dsi_status, local_config, python_module, wait_until

TIMEOUT_S = 5.0  # configs/local.toml heartbeat_timeout_s (the interval is 0.5 s in these configs)


def start(procs: Procs, config, role_id: str):
    proc = procs.start(role_id, python_module("dsi.cli.role", "--config", str(config), "--role", role_id))
    assert proc.wait_ready() == f"READY {role_id}"
    return proc


def test_a_restarted_controller_lists_a_serving_decode_as_serving_within_one_timeout(tmp_path):
    config = local_config(tmp_path, keep=["controller-0", "decode-0"])
    status = ("--config", str(config))
    with Procs(tmp_path) as procs:
        first = start(procs, config, "controller-0")
        decode = start(procs, config, "decode-0")
        address = load_config(config).cluster.controller
        # Polled in this process: a `dsi status` subprocess per poll costs seconds on a busy machine.
        pid = wait_until(lambda: _serving_decode(address), every=0.1).pid
        first.kill_group()  # SIGKILL: no goodbye, its table is gone
        time.sleep(1.0)  # the decode keeps beating into the void meanwhile
        second = start(procs, config, "controller-0")
        back = time.monotonic()
        listed = wait_until(lambda: _serving_decode(address), timeout=TIMEOUT_S, every=0.1)
        assert time.monotonic() - back < TIMEOUT_S
        assert listed.pid == pid == decode.pid  # the same process, never restarted
        shown = dsi_status_json(status)  # and `dsi status` says so
        assert {i["instance_id"]: i["state"] for i in shown["instances"]}["decode-0"] == "serving"
        moves = {(m["role"], m["from"], m["to"]): m["count"] for m in shown["transitions"]}
        assert moves[("decode", "none", "serving")] == 1  # straight back to serving, not via ready
        assert ("decode", "none", "ready") not in moves
        assert "decode-0 (decode): none -> serving (re-registered as serving" in second.log()


def _serving_decode(address: str):
    """decode-0's InstanceInfo when the controller lists it as serving, else None."""
    table = asyncio.run(fetch_instances(address, None, 2.0))
    return next((i for i in table.instances if i.instance_id == "decode-0" and i.state == "serving"), None)


def dsi_status_json(status) -> dict:
    """``dsi status --json``: its instances and transitions (one subprocess)."""
    done = dsi_status("--json", *status)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)
