"""``dsi bench control-plane`` end to end on a small fleet: its figures' structure and the
outcomes behind them (every instance counted by every role, tables of every instance, a
restarted controller's cluster whole again), never their speed."""

from __future__ import annotations

import json

import pytest

from dsi.bench.control_plane import Options, format_figures
from dsi.bench.control_plane_probe import Spread
from dsi.cli.main import main


def test_options_refuse_counts_below_one_and_a_share_outside_zero_to_one():
    with pytest.raises(ValueError, match="instances"):
        Options(instances=0)
    with pytest.raises(ValueError, match="prefill_share"):
        Options(prefill_share=1.0)


def test_a_spread_is_the_median_p99_and_max_of_its_samples():
    s = Spread.of([float(x) for x in range(1, 101)])
    assert (s.median, s.p99, s.max, s.n) == (50.5, 100.0, 100.0, 100)
    assert s.scaled(1e3, 1)["median"] == 50500.0


def test_the_lines_name_each_figure_and_say_which_goals_are_met():
    figures = {
        "registered_s": {"controller": 1.5},
        "goals": {
            "route_table_build_ms": {"value": 1.2, "below": 5.0, "met": True},
            "recovery_s": {"value": None, "below": 10.0, "met": False},
        },
    }
    assert format_figures(figures).splitlines() == [
        f"{'registered_s.controller':32} 1.5",
        f"goal {'route_table_build_ms':27} 1.2 < 5.0: met",
        f"goal {'recovery_s':27} None < 10.0: NOT met",
    ]


@pytest.mark.slow
def test_the_bench_counts_every_instance_in_every_role_and_recovers_from_a_controller_restart(capsys):
    args = ["--instances", "24", "--processes", "2", "--window", "1", "--tables", "5"]
    args += ["--status-runs", "1", "--restarts", "1", "--json"]
    assert main(["bench", "control-plane", *args]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["terms"] | {"cpus": None} == {
        "instances": 24,
        "prefills": 12,
        "decodes": 12,
        "fleet_processes": 2,
        "heartbeat_interval_s": 1.0,
        "heartbeat_timeout_s": 5.0,
        "cpus": None,
    }
    assert set(figures["registered_s"]) == {"controller", "balancer", "entrypoint"}
    cpu = figures["cpu"]
    assert cpu["serving"] == 24 and cpu["suspect"] == 0
    assert all(cpu[role]["mean"] > 0 for role in ("controller", "balancer", "entrypoint", "fleet"))
    assert cpu["controller_us_per_heartbeat"] > 0
    table = figures["route_table"]
    assert (table["prefills"], table["decodes"], table["build_ms"]["n"]) == (12, 12, 5)
    assert table["build_ms"]["median"] > 0  # the balancer's own clock, carried in each table
    assert figures["status"]["cli_s"]["n"] == 1 and figures["status"]["list_ms"]["n"] == 20
    recovery = figures["recovery"]
    assert recovery["runs"] == 1 and recovery["total_s"] is not None  # whole again within the watch
    assert recovery["ready_s"] is not None and recovery["controller_s"] >= recovery["ready_s"]
    assert {name: set(goal) for name, goal in figures["goals"].items()} == {
        name: {"value", "below", "met"}
        for name in ("route_table_build_ms", "controller_cpu_cores", "recovery_s")
    }
