"""``dsi bench rpc`` end to end with a tiny duration: every figure is reported, children are reaped.

Speed is not asserted here (a benchmark prints figures; the machine may be shared): only that the
command runs both serving processes, measures each figure, prints one JSON object and stops them.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing

from dsi.bench import cli as bench_cli
from dsi.bench.rpc import format_table, run_rpc_bench

FIGURES = (
    "ask_per_s",
    "ask_p50_us",
    "ask_p99_us",
    "raw_per_s",
    "raw_p50_us",
    "raw_p99_us",
    "ask_ratio",
    "bulk_gbps",
    "raw_bulk_gbps",
    "bulk_ratio",
    "pipelined_ask_per_s",
    "repeats",
)
TINY = ["--seconds", "0.05", "--repeats", "1", "--frame-kib", "64", "--burst", "4", "--window", "4"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dsi")
    bench_cli.register(parser.add_subparsers(dest="command", required=True))
    return parser


def test_json_has_every_figure_positive(capsys):
    args = _parser().parse_args(["bench", "rpc", "--json", *TINY])
    assert args.func(args) == 0
    figures = json.loads(capsys.readouterr().out)
    for name in FIGURES:
        assert figures[name] > 0, name
    assert figures["repeats"] == 1
    assert figures["ask_ratio"] == figures["ask_per_s"] / figures["raw_per_s"]
    assert figures["bulk_ratio"] == figures["bulk_gbps"] / figures["raw_bulk_gbps"]
    assert multiprocessing.active_children() == []  # both serving processes were terminated


def test_table_names_each_figure():
    figures = run_rpc_bench(seconds=0.05, repeats=1, frame_bytes=64 << 10, burst=4, window=4)
    table = format_table(figures)
    for row in (
        "round trips /s",
        "p50 latency us",
        "p99 latency us",
        "bulk 64 KiB Gbit/s",
        "pipelined asks /s",
    ):
        assert row in table
    assert multiprocessing.active_children() == []
