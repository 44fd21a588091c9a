"""Building the C kernels: without a compiler, one warning per kernel says the torch fallback is used."""

import logging
import subprocess
import sys
import textwrap

from dsi.kernels import native


def test_names_are_the_c_sources():
    assert native.names() == ("dense_gemm", "paged_attention", "row_ops", "thread_pool", "v4_attention")


def test_a_failed_build_is_logged_once_with_its_reason(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("DSI_KERNEL_CACHE", str(tmp_path))
    caplog.set_level(logging.WARNING, logger="dsi.kernels.native")
    native._build.cache_clear()
    try:
        for _ in range(3):
            assert native.library("row_ops") is None
        assert native.why_not("row_ops")
        [record] = caplog.records
        assert record.levelname == "WARNING"
        assert "C kernel row_ops unavailable" in record.getMessage()
        assert native.why_not("row_ops") in record.getMessage()  # the reason
        assert "torch reference" in record.getMessage()
    finally:
        native._build.cache_clear()


def test_a_built_kernel_logs_nothing(caplog):
    caplog.set_level(logging.WARNING, logger="dsi.kernels.native")
    native._build.cache_clear()
    try:
        if native.library("row_ops") is None:  # no compiler on this machine: the warning is the point
            assert "row_ops" in caplog.text
        else:
            assert caplog.records == []
    finally:
        native._build.cache_clear()


def test_a_process_without_a_compiler_says_so_once_per_kernel(tmp_path):
    """A real process with CC pointing nowhere: one line per kernel through dsi's logging, and its
    machine fingerprint says which kernels it lacks."""
    script = textwrap.dedent(
        """
        from dsi.engine.fingerprint import machine_fingerprint
        from dsi.kernels import native
        from dsi.logs import setup_logging

        setup_logging("text", "info", role="prefill-0")
        for _ in range(2):
            for name in native.names():
                native.library(name)
        print(machine_fingerprint().native)
        """
    )
    env = {
        "CC": str(tmp_path / "no-such-cc"),
        "DSI_KERNEL_CACHE": str(tmp_path / "cache"),
        "PATH": "/usr/bin:/bin",
    }
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str({name: False for name in native.names()})
    lines = [line for line in done.stderr.splitlines() if "dsi.kernels.native" in line]
    assert len(lines) == len(native.names()), done.stderr
    for name, line in zip(native.names(), lines, strict=True):
        assert (
            f"WARNING [prefill-0] dsi.kernels.native: C kernel {name} unavailable (cannot build {name}.c"
            in line
        )
        assert "no-such-cc" in line and "torch reference" in line
