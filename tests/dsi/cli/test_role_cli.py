"""dsi-role as a real process: READY, graceful SIGTERM, JSON logs, bad configs."""

import asyncio
import json
import re
import signal
import subprocess

import pytest

from dsi.cli.status import fetch_instances
from dsi.config import load_config
from tests.dsi.cli.procs import REPO_ROOT, Procs, instances, local_config, python_module, wait_until


def role(procs: Procs, config, role_id: str, *extra: str):
    proc = procs.start(
        role_id, python_module("dsi.cli.role", "--config", str(config), "--role", role_id, *extra)
    )
    assert proc.wait_ready() == f"READY {role_id}"
    return proc


def serving(address: str, role_id: str) -> bool:
    """Whether the controller at `address` lists `role_id` as serving (asked in this process)."""
    table = asyncio.run(fetch_instances(address, None, 2.0))
    return any(i.instance_id == role_id and i.state == "serving" for i in table.instances)


def test_sigterm_stops_a_role_which_the_controller_then_lists_as_stopped(procs, tmp_path):
    config = local_config(tmp_path)
    controller = role(procs, config, "controller-0")
    prefill = role(procs, config, "prefill-0")
    address = load_config(config).cluster.controller
    # Polled in this process: a `dsi status` subprocess per poll costs seconds on a busy machine.
    wait_until(lambda: serving(address, "prefill-0"), every=0.1)
    prefill.signal(signal.SIGTERM)
    assert prefill.wait() == 0
    listed = instances("--config", str(config))
    assert listed["prefill-0"]["state"] == "stopped"
    assert listed["controller-0"]["state"] == "serving"
    assert "stopped" in prefill.log()
    controller.signal(signal.SIGTERM)
    assert controller.wait() == 0


def test_json_logs_are_one_object_per_line_naming_the_role(procs, tmp_path):
    config = local_config(tmp_path, keep=["controller-0"])
    controller = role(procs, config, "controller-0", "--log-format", "json")
    controller.signal(signal.SIGTERM)
    assert controller.wait() == 0
    lines = [json.loads(line) for line in controller.log_path.read_text().splitlines()]
    assert lines and all(set(line) >= {"ts", "level", "logger", "msg", "role"} for line in lines)
    assert all(line["role"] == "controller-0" for line in lines)
    assert any(
        line["msg"].startswith("controller-0 (controller) serving on tcp://127.0.0.1:") for line in lines
    )
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["ts"]) for line in lines)
    assert {line["level"] for line in lines} == {"info"}


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (("heartbeat_interval_s = 1.0", "heartbeat_interval_s = -1.0"), "cluster.heartbeat_interval_s"),
        (('kind = "prefill"', 'kind = "prefil"'), "roles[2].kind"),
        # another host's controller and no keys: refused until [security] has keys or insecure = true
        (('controller = "tcp://127.0.0.1:7100"', 'controller = "tcp://10.0.0.1:7100"'), "security"),
    ],
)
def test_bad_config_exits_2_naming_the_key(tmp_path, edit, key):
    bad = tmp_path / "bad.toml"
    bad.write_text((REPO_ROOT / "configs" / "local.toml").read_text().replace(*edit, 1))
    done = subprocess.run(
        python_module("dsi.cli.role", "--config", str(bad)),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert f"{bad}: {key}: " in done.stderr
    assert done.stdout == ""


def test_unknown_role_id_exits_2(tmp_path):
    done = subprocess.run(
        python_module("dsi.cli.role", "--config", str(local_config(tmp_path)), "--role", "nope"),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "no role with id 'nope'" in done.stderr
