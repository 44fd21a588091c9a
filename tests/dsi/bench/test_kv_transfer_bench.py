"""``dsi bench kv-transfer`` end to end on tiny sizes: every figure is reported and the receiver
processes are reaped. Speed is not asserted (a benchmark prints figures; the machine may be shared).
Mooncake's side runs from a venv given with ``--mooncake-venv``: here one whose Python is this one,
with the stand-in engine of fake_mooncake/ (figures, bytes checked) or without any (the reason)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing

import pytest

from dsi.bench import cli as bench_cli
from dsi.bench.kv_transfer import format_table
from tests.dsi.bench.test_kv_mooncake import FAKE, fake_venv

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


def test_mooncake_from_its_own_venv(capsys, tmp_path, monkeypatch):
    fake_venv(tmp_path / "mooncake")
    monkeypatch.setenv("PYTHONPATH", str(FAKE))
    _run("--mooncake-venv", str(tmp_path / "mooncake"))
    figures = json.loads(capsys.readouterr().out)
    assert figures["mooncake_reason"] is None and figures["mooncake"]["verified"] is True
    assert figures["mooncake_tcp_gbps"] > 0 and figures["buffer_mooncake_tcp_gbps"] > 0
    assert figures["tcp_vs_mooncake"] == figures["tcp_gbps"] / figures["mooncake_tcp_gbps"]
    assert figures["mooncake"]["venv"] == str(tmp_path / "mooncake")
    assert "tcp/mooncake tcp" in format_table(figures)
    assert multiprocessing.active_children() == []


def test_the_reason_mooncake_is_missing(capsys, tmp_path, monkeypatch):
    if importlib.util.find_spec("mooncake") is not None:
        pytest.skip("mooncake is importable in dsi's own venv; it never should be")
    fake_venv(tmp_path / "mooncake")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    _run("--mooncake-venv", str(tmp_path / "mooncake"))
    figures = json.loads(capsys.readouterr().out)
    assert figures["mooncake_tcp_gbps"] is None and figures["mooncake"]["verified"] is False
    assert figures["mooncake_reason"].startswith(
        "mooncake transfer engine not importable: ModuleNotFoundError"
    )
    assert "mooncake: mooncake transfer engine not importable" in format_table(figures)
