"""The fork server: engine role processes forked from one preloaded process.

An engine role (prefill, decode) spends most of its start importing torch and dsi's engine: about
1.8 of its 1.9 CPU seconds to READY on the tiny model. ``dsi serve`` starts one fork server, which
imports those modules once, and forks every engine role (and every replacement of a dead one)
from it:

    client --SEQPACKET: {"op": "launch", args} + (stdout, stderr) fds-----------> fork server
           <--{"pid": N}---------------------------------------------------------
    fork server: fork -> child: setsid, SIGTERM when the fork server dies, stdin /dev/null, the
                 fds as stdout and stderr, the environment the fork server started with (what
                 preloading changed in it undone), ``dsi.cli.role.main(args)``, exit with its code
    client --{"op": "status", pid}--> fork server (which reaps its children)
           <--{"code": None while it runs, else as Popen's returncode (negative: the signal)}--

The child is a process of its own, in a session of its own, as ``python -P -m dsi.cli.role``
would be; only the imports are done already. Its command line is the fork server's (which names
``dsi serve``'s config), its process name (``ps -o comm``, ``top``) ``dsi:`` and its role id. The fork server never runs a torch operation (so no
OpenMP thread exists to fork), never starts a thread, and is started with the roles' environment
(libgomp reads its variables when torch loads). It exits when its client closes the socket, and
gets SIGTERM when its client process dies; its children get SIGTERM when it dies.

``ForkServer`` is the client (blocking calls; ``dsi serve`` makes them from a thread), and
``ForkedProcess`` gives a forked role the shape of an asyncio subprocess for ``RoleProcess``: its
exit is seen through a pidfd (Linux 5.3), its status asked of the fork server.

Run as ``python -P -m dsi.provision.forkserver FD`` (FD: its end of the socket pair).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dsi.provision.process import die_with_parent

PRELOAD = ("dsi.cli.role", "dsi.roles.prefill", "dsi.roles.decode", "dsi.roles.engine_role")
ENGINE_KINDS = frozenset({"prefill", "decode"})  # the kinds whose roles fork (dsi's own engine)
_MAX_MESSAGE = 1 << 16  # bytes of one request or answer
_PR_SET_PDEATHSIG = 1
_STATUS_WAIT_S = 5.0  # how long an exited child may stay unreaped by the fork server
_REAP_EVERY_S = 0.5  # the idle fork server's reaping interval


class ForkServerGone(RuntimeError):
    """The fork server exited (or never started): no launch and no status from it."""


# ---- the fork server process ---------------------------------------------------------------------
def serve(sock: socket.socket, preload: Sequence[str] = PRELOAD) -> None:
    """Preload, then answer requests until the client closes its end."""
    environment = dict(os.environ)  # the roles' own, before any import sets a variable
    for module in preload:
        importlib.import_module(module)
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()
    codes: dict[int, int] = {}  # reaped children: pid -> returncode (negative: the signal)
    while True:
        _reap(codes)
        # Reaping here only keeps zombies short-lived: a status request reaps before it answers.
        if not select.select([sock], [], [], _REAP_EVERY_S)[0]:
            continue
        try:
            message, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 2)
        except ConnectionError:
            return
        if not message:
            return
        request = json.loads(message)
        try:
            if request["op"] == "launch":
                pid = _fork_role(request["args"], environment, fds, sock, libc, parent)
                reply: dict[str, Any] = {"pid": pid}
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


def _fork_role(
    args: list[str],
    environment: dict[str, str],
    fds: list[int],
    sock: socket.socket,
    libc: Any,
    parent: int,
) -> int:
    stdout, stderr = fds
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:  # the child: never returns into the fork server's loop
        os.setsid()
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the fork server died before prctl took effect
            os._exit(1)
        sock.close()
        _name_process(args)
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


def _name_process(args: Sequence[str]) -> None:
    """The process name ``ps`` and ``top`` show (15 bytes): ``dsi:`` and the role id (the command
    line stays the fork server's)."""
    ids = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--role"]
    name = f"dsi:{','.join(ids)}" if ids else "dsi-role"
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as comm:
        comm.write(name[:15])


# ---- the client ----------------------------------------------------------------------------------
class ForkServer:
    """A fork server process and the requests to it (thread-safe; each call blocks until answered,
    the first one until the preloading is done).

    cwd, env: the fork server's, and so every forked role's. stderr: where the fork server's own
    output goes (a file object or fd; None: this process's). label: put on the fork server's
    command line, which its forked roles share (``dsi serve`` puts its config's path there, as in
    the command lines of the roles it starts afresh).
    """

    def __init__(
        self,
        cwd: Path | str,
        env: Mapping[str, str],
        stderr: Any = None,
        *,
        label: str = "",
        die_with_client: bool = True,
    ) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        label_args = [label] if label else []
        self.process = subprocess.Popen(
            [sys.executable, "-P", "-m", "dsi.provision.forkserver", str(theirs.fileno()), *label_args],
            pass_fds=[theirs.fileno()],
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
            # The kernel ties this to the starting thread: only a client that starts the fork
            # server from a thread that lives as long as the process asks for it.
            preexec_fn=die_with_parent(os.getpid()) if die_with_client else None,
        )
        theirs.close()
        self._sock = ours
        self._sock.settimeout(180.0)  # the first answer waits for the preloading
        self._lock = threading.Lock()

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def launch(self, args: Sequence[str], stdout: int, stderr: int) -> int:
        """Fork ``dsi.cli.role.main(args)`` with ``stdout`` and ``stderr`` (fds, not closed here);
        its pid. ForkServerGone when the fork server has exited."""
        return self._ask({"op": "launch", "args": list(args)}, [stdout, stderr])["pid"]

    def returncode(self, pid: int) -> int | None:
        """``pid``'s exit status once the fork server reaped it, else None."""
        return self._ask({"op": "status", "pid": pid}, [])["code"]

    def stop(self, timeout_s: float = 10.0) -> None:
        """Close the socket (the fork server exits at its end) and reap it; forked roles that
        still run get SIGTERM from the kernel."""
        self._sock.close()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def _ask(self, request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        with self._lock:
            try:
                socket.send_fds(self._sock, [json.dumps(request).encode()], fds)
                answer = self._sock.recv(_MAX_MESSAGE)
            except OSError as exc:
                raise ForkServerGone(f"the fork server (pid {self.process.pid}) is gone: {exc}") from exc
        if not answer:
            raise ForkServerGone(f"the fork server (pid {self.process.pid}) exited")
        return json.loads(answer)


class ForkedProcess:
    """A role the fork server forked, as ``RoleProcess`` uses an asyncio subprocess: ``pid``,
    ``returncode``, ``stdout`` (a StreamReader) and ``await wait()``."""

    def __init__(self, server: ForkServer, pid: int, stdout: asyncio.StreamReader, pidfd: int | None) -> None:
        self.server, self.pid, self.stdout = server, pid, stdout
        self.returncode: int | None = None
        self._pidfd = pidfd
        self._exited = asyncio.get_running_loop().create_future()
        if pidfd is not None:
            asyncio.get_running_loop().add_reader(pidfd, self._on_exit)
        else:  # gone before its pidfd was opened
            self._exited.set_result(None)

    @classmethod
    async def launch(cls, server: ForkServer, args: Sequence[str], stderr: int = 2) -> ForkedProcess:
        """Fork ``dsi.cli.role.main(args)``: stdout a pipe read here, stderr ``stderr`` (fd)."""
        loop = asyncio.get_running_loop()
        read, write = os.pipe()
        try:
            pid = await asyncio.to_thread(server.launch, args, write, stderr)
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        reader = asyncio.StreamReader(loop=loop)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read, "rb", 0))
        try:
            pidfd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:
            pidfd = None
        return cls(server, pid, reader, pidfd)

    def _on_exit(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._pidfd is not None
        loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._pidfd = None
        if not self._exited.done():
            self._exited.set_result(None)

    async def wait(self) -> int:
        """The exit status, once the process has ended; SIGTERM's when the fork server is gone
        (the kernel sent it that when the fork server died, and the status, which only the fork
        server could reap, is lost: a role that stopped gracefully on it is not one that retired)."""
        if self.returncode is not None:
            return self.returncode
        await asyncio.shield(self._exited)
        deadline = asyncio.get_running_loop().time() + _STATUS_WAIT_S
        code: int | None = None
        while code is None:
            try:
                code = await asyncio.to_thread(self.server.returncode, self.pid)
            except ForkServerGone:
                code = -signal.SIGTERM
            if code is None:
                if asyncio.get_running_loop().time() > deadline:
                    code = -signal.SIGKILL  # exited, never reaped: say it died
                else:
                    await asyncio.sleep(0.02)
        self.returncode = code
        return code


class RoleForker:
    """What ``LocalProvisioner`` forks: ``args_of(role_id, argv)`` gives the ``dsi.cli.role``
    arguments of a role the fork server can run (see :func:`forkable`), None for one started
    afresh. The fork server is started at the first fork, from the calling (event loop) thread,
    with ``env`` and this working directory, and started again after it died."""

    def __init__(
        self,
        args_of: Callable[[str, Sequence[str]], list[str] | None],
        env: Mapping[str, str],
        label: str = "",
    ) -> None:
        self.args_of = args_of
        self._env = dict(env)
        self._label = label
        self._server: ForkServer | None = None

    @property
    def server_pid(self) -> int | None:
        """The fork server's pid while it runs."""
        return self._server.process.pid if self._server is not None and self._server.alive else None

    async def fork(self, args: Sequence[str]) -> ForkedProcess:
        """ForkServerGone when the fork server cannot take it."""
        if self._server is None or not self._server.alive:
            if self._server is not None:
                await asyncio.to_thread(self._server.stop)
            self._server = ForkServer(os.getcwd(), self._env, label=self._label)
        return await ForkedProcess.launch(self._server, args)

    async def close(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await asyncio.to_thread(server.stop)


def forkable(argv: Sequence[str], kind: str, engine: str | None) -> list[str] | None:
    """The ``dsi.cli.role`` arguments of ``argv`` when the fork server can run it: this
    interpreter's ``-P -m dsi.cli.role`` for a role of an engine kind on dsi's own engine; None
    otherwise (a vLLM role, another interpreter, another command)."""
    if kind not in ENGINE_KINDS or engine == "vllm":
        return None
    head = [sys.executable, "-P", "-m", "dsi.cli.role"]
    return list(argv[len(head) :]) if list(argv[: len(head)]) == head else None


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
