"""The test suite's fork server for its engine role processes (dsi.provision.forkserver).

An engine role (prefill, decode) spends about 1.8 of its 1.9 CPU seconds to READY importing torch
and dsi's engine, and the suite starts about a hundred of them outside ``dsi serve`` (which has
its own fork server). ``Proc`` (tests/dsi/cli/procs.py) has the suite's one fork server fork the
``dsi.cli.role`` processes of engine roles started with the usual environment; the
fresh-interpreter start stays covered by every other role process, by ``dsi serve --no-fork-server``
and by tests/roles/test_torch_free_roles.py.
"""

from __future__ import annotations

import atexit
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from dsi.provision.forkserver import ForkServer


class Launcher(ForkServer):
    """The fork server of this test process (``shared()``), logging to ``log_path``."""

    _shared: Launcher | None = None
    _shared_lock = threading.Lock()

    def __init__(self, cwd: Path, env: dict[str, str], log_path: Path) -> None:
        with open(log_path, "ab") as log:
            # Started from whichever thread asks first: not tied to that thread's life.
            super().__init__(cwd, env, stderr=log, die_with_client=False)
        self.log_path = log_path
        atexit.register(self.stop)

    @classmethod
    def shared(cls, cwd: Path, env: dict[str, str], log_path: Path) -> Launcher:
        with cls._shared_lock:
            if cls._shared is None or not cls._shared.alive:
                cls._shared = cls(cwd, env, log_path)
            return cls._shared


class LaunchedProcess:
    """What ``Proc`` uses of a ``subprocess.Popen``, for a role the launcher forked."""

    def __init__(self, launcher: Launcher, pid: int, stdout: Any, args: list[str]) -> None:
        self.launcher, self.pid, self.stdout, self.args = launcher, pid, stdout, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.launcher.returncode(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.02)
        assert self.returncode is not None
        return self.returncode
