"""The Mooncake baseline's runner protocol, without Mooncake: the runner run by this interpreter
(no ``mooncake`` here) says why in its answer; with a stand-in engine (fake_mooncake/, writes over
a local socket) it times writes and checks the receiver's bytes; a venv that already has the
package is used as it is, never installed again."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dsi.bench.kv_mooncake import (
    PACKAGE,
    RUNNER,
    MooncakeTcp,
    MooncakeUnavailable,
    install_mooncake,
    open_mooncake,
)

FAKE = Path(__file__).with_name("fake_mooncake")
CASES = [(20, 4096), (1, 65536)]  # [(parts, part_bytes)]: the blocks case and the buffer case


def fake_venv(root: Path, package: str = PACKAGE) -> Path:
    """A venv as install_mooncake leaves it (its marker names ``package``), whose python is this one."""
    python = root / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    (root / ".dsi-peer-installed").write_text(package + "\n")
    return python


@pytest.fixture
def no_mooncake():
    if importlib.util.find_spec("mooncake") is not None:
        pytest.skip("mooncake is importable in dsi's own venv; it never should be")


@pytest.fixture
def fake_mooncake(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(FAKE))


def answers(*requests: dict, env: dict | None = None) -> list[dict]:
    """The runner's answers to ``requests``, one JSON line each."""
    lines = "".join(json.dumps(r) + "\n" for r in requests)
    done = subprocess.run(
        [sys.executable, str(RUNNER)], input=lines, capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_without_mooncake_the_runner_answers_why(no_mooncake):
    (reply,) = answers({"op": "start", "cases": CASES})
    assert reply == {
        "ok": False,
        "reason": "mooncake transfer engine not importable: ModuleNotFoundError: No module named 'mooncake'",
    }


def test_a_venv_without_mooncake_gives_the_bench_its_reason(tmp_path, no_mooncake):
    venv = tmp_path / "mooncake"
    python = fake_venv(venv)
    assert install_mooncake(venv) == (python, "")  # the marker names the package: nothing installed
    baseline, reason = open_mooncake(venv, PACKAGE, CASES)
    assert baseline is None and reason is not None
    assert reason.startswith("mooncake transfer engine not importable: ModuleNotFoundError")


def test_writes_are_timed_and_their_bytes_checked_at_the_receiver(fake_mooncake):
    baseline = MooncakeTcp(Path(sys.executable), CASES)
    try:
        assert baseline.version == "unknown"  # the stand-in is no installed distribution
        for case in (0, 1, 0):
            assert 0 < baseline.write(case, verify=True) < 10
        assert baseline.write(1) > 0
    finally:
        baseline.close()
    assert baseline._process.returncode == 0


def test_bytes_that_differ_at_the_receiver_are_a_failure(fake_mooncake, monkeypatch):
    monkeypatch.setenv("FAKE_MOONCAKE_CORRUPT", "1")
    baseline = MooncakeTcp(Path(sys.executable), CASES)
    try:
        assert baseline.write(0) > 0  # not checked: nothing to notice
        with pytest.raises(MooncakeUnavailable, match="the receiver's bytes differ"):
            baseline.write(0, verify=True)
    finally:
        baseline.close()


def test_requests_out_of_order_or_malformed_are_refused_with_a_reason():
    (reply,) = answers({"op": "write", "case": 0})
    assert reply["ok"] is False and "start first" in reply["reason"]
    (reply,) = answers({"op": "start", "cases": [[0, 10]]})
    assert reply == {
        "ok": False,
        "reason": "cases must be [[parts, part_bytes], ...] of positive sizes, not [(0, 10)]",
    }
    env = {"PYTHONPATH": str(FAKE), "PATH": "/usr/bin:/bin"}
    replies = answers({"op": "start", "cases": CASES}, {"op": "write", "case": 7}, {"op": "stop"}, env=env)
    assert replies[0]["ok"] and replies[1:] == [  # the runner exits after a failure: no third answer
        {"ok": False, "reason": "bad request: IndexError: list index out of range"}
    ]


def test_an_install_that_fails_says_what_pip_said(tmp_path, monkeypatch):
    venv = tmp_path / "mooncake"
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))
    python, reason = install_mooncake(venv, "mooncake-transfer-engine-non-cuda==0.0.0")
    assert python is None
    assert reason.startswith(f"cannot install mooncake-transfer-engine-non-cuda==0.0.0 into {venv}:")
