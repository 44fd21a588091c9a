"""``dsi bench kv-transfer`` end to end on tiny sizes: every figure is reported and the receiver
processes are reaped. Speed is not asserted (a benchmark prints figures; the machine may be shared)."""

from __future__ import annotations

import argparse
import json
import multiprocessing

from dsi.bench import cli as bench_cli
from dsi.bench.kv_mooncake import unavailable
from dsi.bench.kv_transfer import format_table

SMALL = ["--blocks", "20", "--block-kib", "16", "--buffer-mib", "1", "--repeats", "1"]
HEADLINE = (
    "shm_gbps",
    "tcp_gbps",
    "tcp_encrypted_gbps",
    "memcpy_gbps",
    "shm_ratio",
    "tcp_ratio",
    "encrypted_ratio",
)
NAMES = ("shm", "tcp", "tcp_encrypted", "memcpy")
PER_CASE = tuple(f"{case}_{name}_gbps" for case in ("blocks", "buffer") for name in NAMES)


def _run(*extra: str) -> None:
    parser = argparse.ArgumentParser(prog="dsi")
    bench_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", "kv-transfer", "--json", *SMALL, *extra])
    assert args.func(args) == 0


def test_every_figure_without_mooncake(capsys):
    _run("--no-mooncake")
    figures = json.loads(capsys.readouterr().out)
    for name in (*HEADLINE, *PER_CASE):
        assert figures[name] > 0, name
    assert figures["mooncake_tcp_gbps"] is None and "disabled" in figures["mooncake_reason"]
    assert (figures["blocks"], figures["block_kib"], figures["buffer_mib"]) == (20, 16, 1)
    assert multiprocessing.active_children() == []
    assert figures["encrypted_ratio"] == figures["tcp_encrypted_gbps"] / figures["tcp_gbps"]
    table = format_table(figures)
    assert "target >= 0.5" in table and "tcp encrypted/clear" in table


def test_mooncake_figure_or_the_reason_it_is_missing(capsys):
    _run()
    figures = json.loads(capsys.readouterr().out)
    if unavailable() is None:
        assert figures["mooncake_tcp_gbps"] > 0 and figures["buffer_mooncake_tcp_gbps"] > 0
    else:
        assert figures["mooncake_tcp_gbps"] is None and figures["mooncake_reason"]
    assert multiprocessing.active_children() == []
