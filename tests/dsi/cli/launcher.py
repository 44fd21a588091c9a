"""A preloaded parent for the test suite's engine role processes.

An engine role (prefill, decode) spends about 1.8 of its 1.9 CPU seconds to READY importing torch
and dsi's engine. The suite starts about a hundred of them, on two cores. The launcher imports
those modules once and forks each role from itself:

    test process --SEQPACKET: {"op": "launch", args} + (stdout, stderr) fds-----------> launcher
                 <--{"pid": N}------------------------------------------------------------
    launcher: fork -> child: setsid, stdin /dev/null, the fds as stdout and stderr, the
              environment the launcher started with (what preloading changed in it undone),
              ``dsi.cli.role.main(args)``, exit with its code
    test process --{"op": "status", pid}--> launcher (which reaps its children)
                 <--{"code": None while it runs, else as Popen's returncode}---

The child is a real process with real sockets, in a session of its own, as ``python -m
dsi.cli.role`` would be; only the imports are already done. The launcher itself never runs a
torch operation (so no OpenMP thread exists to fork) and is started with the roles' own
environment (libgomp reads its variables when torch loads). ``Proc`` (tests/dsi/cli/procs.py)
uses it only for ``dsi.cli.role`` processes of engine roles started with that environment; the
fresh-interpreter start stays covered by every other role process, by ``dsi serve``'s, and by
tests/roles/test_torch_free_roles.py.

Run as ``python -m tests.dsi.cli.launcher FD`` (FD: its end of the socket pair).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

PRELOAD = ("dsi.cli.role", "dsi.roles.prefill", "dsi.roles.decode", "dsi.roles.engine_role")
_MAX_MESSAGE = 1 << 16  # bytes of one request or answer


# ---- the launcher process ------------------------------------------------------------------------
def serve(sock: socket.socket) -> None:
    """Preload, then answer requests until the test process closes its end."""
    environment = dict(os.environ)  # the roles' own, before any import sets a variable
    for module in PRELOAD:
        importlib.import_module(module)
    codes: dict[int, int] = {}  # reaped children: pid -> returncode (negative: the signal)
    while True:
        _reap(codes)
        if not select.select([sock], [], [], 0.02)[0]:
            continue
        message, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 2)
        if not message:
            return
        request = json.loads(message)
        try:
            if request["op"] == "launch":
                reply: dict[str, Any] = {"pid": _fork_role(request["args"], environment, fds, sock)}
            else:
                _reap(codes)
                reply = {"code": codes.get(request["pid"])}
        finally:
            for fd in fds:
                os.close(fd)
        sock.send(json.dumps(reply).encode())


def _reap(codes: dict[int, int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        codes[pid] = os.waitstatus_to_exitcode(status)


def _fork_role(args: list[str], environment: dict[str, str], fds: list[int], sock: socket.socket) -> int:
    stdout, stderr = fds
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:  # the child: never returns into the launcher's loop
        os.setsid()
        sock.close()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(stdout, 1)
        os.dup2(stderr, 2)
        for fd in (devnull, stdout, stderr):
            if fd > 2:
                os.close(fd)
        os.environ.clear()
        os.environ.update(environment)
        sys.argv = ["dsi-role", *args]
        from dsi.cli.role import main

        code = main(args)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


# ---- the test process's side ---------------------------------------------------------------------
class Launcher:
    """The launcher process of this test process (``shared()``), and requests to it."""

    _shared: Launcher | None = None
    _shared_lock = threading.Lock()

    def __init__(self, cwd: Path, env: dict[str, str], log_path: Path) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.dsi.cli.launcher", str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
            )
        theirs.close()
        self._sock = ours
        self._sock.settimeout(120.0)  # the first answer waits for the preloading
        self._lock = threading.Lock()
        self.log_path = log_path
        atexit.register(self.stop)

    def stop(self) -> None:
        """Close the socket (the launcher exits at its end) and reap the launcher."""
        self._sock.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    @classmethod
    def shared(cls, cwd: Path, env: dict[str, str], log_path: Path) -> Launcher:
        with cls._shared_lock:
            if cls._shared is None or cls._shared.process.poll() is not None:
                cls._shared = cls(cwd, env, log_path)
            return cls._shared

    def launch(self, args: list[str], stdout: int, stderr: int) -> int:
        """Fork ``dsi.cli.role.main(args)`` in the launcher's working directory and environment;
        its pid."""
        return self._ask({"op": "launch", "args": args}, [stdout, stderr])["pid"]

    def returncode(self, pid: int) -> int | None:
        return self._ask({"op": "status", "pid": pid}, [])["code"]

    def _ask(self, request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        with self._lock:
            socket.send_fds(self._sock, [json.dumps(request).encode()], fds)
            answer = self._sock.recv(_MAX_MESSAGE)
        if not answer:
            raise RuntimeError(f"the role launcher exited; its log: {self.log_path.read_text()[-2000:]}")
        return json.loads(answer)


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


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
