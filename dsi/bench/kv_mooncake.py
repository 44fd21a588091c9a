"""Mooncake's TCP transport as the baseline of ``dsi bench kv-transfer``, from a venv of its own.

Mooncake is never a dsi dependency and never enters dsi's venv. ``install_mooncake`` makes a venv
(default ``run/peers/mooncake`` under the current directory) and pip-installs ``PACKAGE`` into it
once (a marker file names what was installed; another package spec reinstalls). ``MooncakeTcp`` runs
dsi.bench.kv_mooncake_runner with that venv's Python: a sender process that starts its own
receiver process, both on 127.0.0.1 with the P2P handshake and the "tcp" protocol, driven by
JSON lines (the runner's docstring has the protocol). Mooncake's own log goes to
``<venv>.log``. Anything that keeps Mooncake from running (the install, the import, its
``initialize``, a failed write) becomes a reason string the bench prints in its JSON.

The default package is the non-CUDA build: ``mooncake-transfer-engine`` is the CUDA build and
fails at import on a machine without CUDA (``ImportError: libcudart.so.12: cannot open shared
object file``, found on the CPU machine this was written on); the TCP transport needs no CUDA.
"""

from __future__ import annotations

import contextlib
import json
import select
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

DEFAULT_VENV = Path("run/peers/mooncake")
PACKAGE = "mooncake-transfer-engine-non-cuda==0.3.13.post1"
RUNNER = Path(__file__).with_name("kv_mooncake_runner.py")
_MARKER = ".dsi-peer-installed"
_INSTALL_TIMEOUT_S = 900.0
_START_TIMEOUT_S = 120.0  # the runner makes its sources (random bytes) and starts two engines
_WRITE_TIMEOUT_S = 120.0


class MooncakeUnavailable(Exception):
    """Mooncake cannot be measured here; the message says exactly why."""


def install_mooncake(venv: Path = DEFAULT_VENV, package: str = PACKAGE) -> tuple[Path | None, str]:
    """The venv's Python with ``package`` installed (made now unless it is already), or None and why not."""
    python = venv / "bin" / "python"
    marker = venv / _MARKER
    if python.exists() and marker.exists() and marker.read_text().strip() == package:
        return python, ""
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "-q", "install", package]
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
        subprocess.run(pip, check=True, capture_output=True, timeout=_INSTALL_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        tail = (getattr(exc, "stderr", b"") or b"").decode(errors="replace")
        tail = "\n".join(line for line in tail.splitlines() if not line.startswith("WARNING"))[-400:]
        return None, f"cannot install {package} into {venv}: {exc} {tail}".strip()
    marker.write_text(package + "\n")
    return python, ""


class MooncakeTcp:
    """The runner started by ``python``, its sources made for ``cases`` ([(parts, part_bytes)]).

    Raises MooncakeUnavailable (the runner's reason) when Mooncake cannot start."""

    def __init__(self, python: Path, cases: list[tuple[int, int]], log: Path | None = None) -> None:
        self.log = log
        with open(log, "ab") if log is not None else contextlib.nullcontext(subprocess.DEVNULL) as err:
            self._process = subprocess.Popen(
                [str(python), str(RUNNER)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        try:
            self.version: str = self._ask({"op": "start", "cases": cases}, _START_TIMEOUT_S)["version"]
        except MooncakeUnavailable:
            self.close()
            raise

    def write(self, case: int, verify: bool = False) -> float:
        """Seconds to write every part of ``cases[case]`` (timed by the runner); with ``verify``,
        MooncakeUnavailable unless the receiver then holds exactly the source's bytes."""
        reply = self._ask({"op": "write", "case": case, "verify": verify}, _WRITE_TIMEOUT_S)
        if verify and not reply["equal"]:
            raise MooncakeUnavailable(f"mooncake wrote case {case}, but the receiver's bytes differ")
        return float(reply["seconds"])

    def close(self) -> None:
        if self._process.poll() is None:
            with contextlib.suppress(MooncakeUnavailable, OSError, ValueError):
                self._ask({"op": "stop"}, 10.0)
        try:
            self._process.wait(10.0)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        for pipe in (self._process.stdin, self._process.stdout):
            if pipe is not None:
                pipe.close()

    def _ask(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        stdin, stdout = self._process.stdin, self._process.stdout
        assert stdin is not None and stdout is not None
        try:
            stdin.write(json.dumps(request) + "\n")
            stdin.flush()
        except OSError:
            pass  # the runner is gone: the read below says so
        line = _read_line(stdout, timeout_s)
        if line is None:
            self._process.kill()
            raise MooncakeUnavailable(
                f"the mooncake runner gave no answer to {request['op']} in {timeout_s}s"
            )
        if not line:
            raise MooncakeUnavailable(
                f"the mooncake runner exited (code {self._process.wait()}) without an answer to"
                f" {request['op']}{self._see_log()}"
            )
        reply = json.loads(line)
        if not reply["ok"]:
            raise MooncakeUnavailable(reply["reason"])
        return reply

    def _see_log(self) -> str:
        return f"; its log: {self.log}" if self.log is not None else ""


def _read_line(stream: IO[str], timeout_s: float) -> str | None:
    """One line ("" at the end of the stream), or None when nothing came in ``timeout_s``."""
    ready, _, _ = select.select([stream], [], [], timeout_s)
    return stream.readline() if ready else None


def open_mooncake(
    venv: Path, package: str, cases: list[tuple[int, int]]
) -> tuple[MooncakeTcp | None, str | None]:
    """A started MooncakeTcp (installing it into ``venv`` first when needed), or None and why not."""
    python, reason = install_mooncake(venv, package)
    if python is None:
        return None, reason
    try:
        return MooncakeTcp(python, cases, venv.with_name(venv.name + ".log")), None
    except MooncakeUnavailable as error:
        return None, str(error)
