"""dsi scale and the autoscaler's part of dsi status: formatting, and against a real controller."""

from __future__ import annotations

import json

import pytest

from dsi.cli.main import main
from dsi.cli.scale_view import format_scale, scale_json
from dsi.messages.control import ScaleDecision, ScaleRole, ScaleStatus
from tests.dsi.cli.procs import REPO_ROOT, local_config, python_module

ROLE = ScaleRole(
    "decode",
    1,
    5,
    1,
    serving=3,
    ready=1,
    starting=0,
    draining=1,
    target=3,
    pool_target=1,
    wanted=4,
    demand=4.0,
    capacity=2.0,
    manual=-1,
    stop=["decode-2"],
)
DECISION = ScaleDecision(
    0.0,
    "decode",
    1,
    1,
    0,
    4.0,
    2.0,
    need=3,
    target=2,
    take=1,
    start=1,
    pool_target=1,
    reasons=["rate_limit: 3 is 2 from serving 1, more than max_change 1: 2 this interval"],
)
STATUS = ScaleStatus(True, 5.0, 0.8, [ROLE], [DECISION])


def test_table_shows_quota_use_targets_pool_and_the_last_decisions():
    lines = format_scale(STATUS).splitlines()
    assert lines[0] == "autoscale: every 5s; no scale-down while quota use is above 0.8"
    assert lines[1].split() == [
        "ROLE",
        "SERVING",
        "READY",
        "STARTING",
        "DRAINING",
        "TARGET",
        "POOL",
        "WANTED",
        "QUOTA",
        "USE",
        "DEMAND",
        "CAPACITY",
        "MANUAL",
    ]
    assert lines[2].split() == ["decode", "3", "1", "0", "1", "3", "1/1", "4", "3/5", "(0.60)", "4", "2", "-"]
    assert lines[3] == "last decisions, oldest first:"
    assert lines[4].endswith(
        " decode: serving 1, ready 1, starting 0, demand 4 -> need 3, target 2: take 1, start 1"
    )
    assert lines[5] == "  rate_limit: 3 is 2 from serving 1, more than max_change 1: 2 this interval"
    assert format_scale(ScaleStatus(False)) == "autoscale: off (no [autoscale] section)"


def test_json_is_plain_objects_with_quota_use():
    data = json.loads(json.dumps(scale_json(STATUS)))
    [role] = data["roles"]
    assert (role["role"], role["serving"], role["quota_use"], role["stop"]) == (
        "decode",
        3,
        0.6,
        ["decode-2"],
    )
    [entry] = data["decisions"]
    assert (entry["need"], entry["target"], entry["take"], entry["start"]) == (3, 2, 1, 1)


def test_a_bad_count_is_refused_before_anything_is_asked(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["scale", "decode", "many", "--controller", "tcp://127.0.0.1:9"])
    assert exit_info.value.code == 2
    assert "expected a count of instances or 'auto', got 'many'" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.concurrent
def test_scale_sets_a_target_within_bounds_and_status_shows_it(procs, tmp_path, capsys):
    config = str(
        local_config(tmp_path, keep=["controller-0"], source=REPO_ROOT / "configs" / "autoscale.toml")
    )
    role = python_module("dsi.cli.role", "--config", config)
    assert procs.start("controller", role).wait_ready() == "READY controller-0"

    assert main(["scale", "decode", "6", "--config", config]) == 2
    assert capsys.readouterr().err == "dsi scale: 6 is outside decode's bounds [1, 5]\n"
    assert main(["scale", "prefill", "1", "--config", config]) == 2
    assert "'prefill' is not scaled (scaled roles: decode)" in capsys.readouterr().err

    assert main(["scale", "decode", "2", "--config", config, "--json"]) == 0
    [decode] = json.loads(capsys.readouterr().out)["roles"]
    assert (decode["manual"], decode["min_instances"], decode["max_instances"]) == (2, 1, 5)

    assert main(["status", "--config", config]) == 0
    out = capsys.readouterr().out
    assert "autoscale: every 5s; no scale-down while quota use is above 0.8" in out
    [row] = [line.split() for line in out.splitlines() if line.startswith("decode ")]
    assert row[-1] == "2"  # MANUAL

    assert main(["scale", "decode", "auto", "--config", config, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["roles"][0]["manual"] == -1
    assert main(["status", "--config", config, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["autoscale"]["enabled"] is True and data["autoscale"]["roles"][0]["manual"] == -1
