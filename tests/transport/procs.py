"""Start echo_server child processes for tests, and always reap them.

Use it from a fixture so that teardown runs even when the test fails::

    @pytest.fixture
    def servers(tmp_path):
        with EchoServers(tmp_path) as group:
            yield group

    proc = servers.start(free_address())   # returns once the child printed READY
    proc.kill()                            # SIGKILL by pid
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from dsi.transport.ports import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 60.0  # generous: the machine is shared and python + numpy import is slow there


def free_address() -> str:
    """A tcp endpoint on 127.0.0.1 whose port was free a moment ago."""
    return f"tcp://127.0.0.1:{free_port()}"


class EchoServerProcess:
    """One ``python -m tests.transport.echo_server`` child; stderr goes to ``log_path``."""

    def __init__(self, address: str, log_path: Path, curve_dir: Path | None = None) -> None:
        cmd = [sys.executable, "-m", "tests.transport.echo_server", "--bind", address]
        if curve_dir is not None:
            cmd += ["--curve-dir", str(curve_dir)]
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self._proc = subprocess.Popen(
                cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, bufsize=0
            )
        try:
            self.address = self._wait_ready(address)
        except BaseException:
            self.kill()
            raise

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: the process gets no chance to answer anyone."""
        if self.alive:
            os.kill(self.pid, signal.SIGKILL)
        self._proc.wait()
        self._close_pipe()

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; the exit status (raises TimeoutExpired if it does not exit)."""
        if self.alive:
            os.kill(self.pid, signal.SIGTERM)
        code = self._proc.wait(timeout)
        self._close_pipe()
        return code

    def _wait_ready(self, address: str) -> str:
        deadline = time.monotonic() + READY_TIMEOUT_S
        fd = self._proc.stdout.fileno()  # type: ignore[union-attr]
        out = b""
        while b"\n" not in out:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"echo_server on {address} not READY in {READY_TIMEOUT_S}s: {self._log()}")
            readable, _, _ = select.select([fd], [], [], remaining)
            if readable:
                chunk = os.read(fd, 4096)
                if not chunk:
                    code = self._proc.wait()
                    raise RuntimeError(f"echo_server on {address} exited with {code}: {self._log()}")
                out += chunk
        line = out.split(b"\n", 1)[0].decode()
        if not line.startswith("READY "):
            raise RuntimeError(f"echo_server printed {line!r} instead of READY: {self._log()}")
        return line.removeprefix("READY ")

    def _close_pipe(self) -> None:
        if self._proc.stdout is not None:
            self._proc.stdout.close()

    def _log(self) -> str:
        return self.log_path.read_text(errors="replace")[-2000:]


class EchoServers:
    """Context manager over the echo_server children of one test; exit SIGKILLs the live ones."""

    def __init__(self, log_dir: Path) -> None:
        self._log_dir = log_dir
        self._procs: list[EchoServerProcess] = []

    def start(self, address: str, curve_dir: Path | None = None) -> EchoServerProcess:
        log_path = self._log_dir / f"echo_server-{len(self._procs)}.log"
        proc = EchoServerProcess(address, log_path, curve_dir)
        self._procs.append(proc)
        return proc

    def __enter__(self) -> EchoServers:
        return self

    def __exit__(self, *_exc: object) -> None:
        for proc in reversed(self._procs):
            proc.kill()
