"""RoleProcess: one child process that announces ``READY`` on stdout, stopped as a process group.

The child runs in its own session, so a terminal's Ctrl-C reaches only its parent, which then
stops the children in order. It asks the kernel for SIGTERM when the parent dies
(PR_SET_PDEATHSIG), so not even a SIGKILLed parent leaves orphans. Stopping sends SIGTERM to the
child's process group, waits `grace_s`, then sends SIGKILL.

The roles of one host share its cores, so a child's OpenMP threads (torch's, libgomp) sleep at
once at a barrier (``OMP_WAIT_POLICY=PASSIVE``) unless the environment sets a policy or a spin
count (``GOMP_SPINCOUNT``). Measured on 2 cores with configs/local.toml's four engines of two
threads each: an engine alone computes twice as fast when its threads spin (a 2,060-token
prompt's TTFT 0.28 s with ``GOMP_SPINCOUNT=10000`` against 0.48 s passive), but when requests
come in bursts the spinning threads of the busy engines take the cores from each other (in
``dsi sim validate``'s slice, TTFT p90 1.33 s against 0.53-0.56 s passive). Sleeping is the
default that holds under load; where each engine has cores of its own (the sum of the engines'
``[engine] threads`` within the host's cores), set ``GOMP_SPINCOUNT=10000`` in the environment.
Dense engines (Llama, Gemma) take most of the sleeping barriers' cost off their batch-invariant
products where waits are passive: the tiles of a product are shared out among their threads in
one hand-off (:mod:`dsi.engine.tile_workers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from dsi.provision.base import StartFailed

if TYPE_CHECKING:
    from dsi.provision.forkserver import ForkedProcess

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


class RoleProcess:
    """`name` is what log lines call the process (its role id)."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process | ForkedProcess) -> None:
        self.name = name
        self._proc = proc
        self._copy: asyncio.Task | None = None

    @classmethod
    async def spawn(cls, name: str, argv: Sequence[str]) -> RoleProcess:
        """Start `argv`; stdout is read by `ready`, stderr is shared with this process."""
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                start_new_session=True,
                env=role_environment(os.environ),
                preexec_fn=die_with_parent(os.getpid()),
            )
        except OSError as exc:
            raise StartFailed(f"{name}: cannot start {argv[0]}: {exc}") from exc
        return cls(name, proc)

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    async def ready(self, timeout_s: float) -> str:
        """The rest of the ``READY ...`` line; later stdout lines are copied to ours.
        StartFailed when the process exits, prints something else or stays silent `timeout_s`."""
        stdout = self._proc.stdout
        if stdout is None:
            raise StartFailed(f"{self.name} was started without a stdout pipe")
        try:
            raw = await asyncio.wait_for(stdout.readline(), timeout_s)
        except TimeoutError:
            raise StartFailed(f"{self.name} (pid {self.pid}) was not READY within {timeout_s:g}s") from None
        line = raw.decode(errors="replace").rstrip("\n")
        if not line.startswith("READY"):
            said = (
                f"exited with {describe_exit(await self._proc.wait())}" if not line else f"printed {line!r}"
            )
            raise StartFailed(f"{self.name} (pid {self.pid}) {said} before it was READY")
        self._copy = asyncio.get_running_loop().create_task(_copy_lines(stdout), name=f"{self.name}.stdout")
        return line.removeprefix("READY").strip()

    async def wait(self) -> int:
        """The exit status, once the process has ended."""
        return await self._proc.wait()

    async def terminate(self, grace_s: float) -> int:
        """SIGTERM the process group, SIGKILL it after `grace_s` seconds; the exit status."""
        self._signal_group(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(self._proc.wait()), grace_s)
        except TimeoutError:
            log.warning("%s (pid %d) ignored SIGTERM for %gs; killing it", self.name, self.pid, grace_s)
            self._signal_group(signal.SIGKILL)
        code = await self._proc.wait()
        await self.close()
        return code

    def kill(self) -> None:
        """SIGKILL the process group at once (a stopped or hung process cannot take a SIGTERM)."""
        self._signal_group(signal.SIGKILL)

    async def close(self) -> None:
        """Stop copying stdout (the process is not touched)."""
        if self._copy is not None:
            self._copy.cancel()
            await asyncio.gather(self._copy, return_exceptions=True)

    def _signal_group(self, sig: signal.Signals) -> None:
        # An exited but unreaped child keeps its pid (and so its group id): no reuse race there.
        # Once reaped, returncode is set and nothing is sent.
        if self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)


def role_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` for a role process: with ``OMP_WAIT_POLICY=PASSIVE`` unless it chose an
    OpenMP wait policy or a spin count itself (see the module docstring)."""
    env = dict(environ)
    if "OMP_WAIT_POLICY" not in env and "GOMP_SPINCOUNT" not in env:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    return env


def describe_exit(code: int | None) -> str:
    """``status 1``, ``SIGKILL`` (a negative status is the signal that ended the process)."""
    if code is None:
        return "no status yet"
    if code < 0:
        with contextlib.suppress(ValueError):
            return signal.Signals(-code).name
    return f"status {code}"


async def _copy_lines(stream: asyncio.StreamReader) -> None:
    while line := await stream.readline():
        sys.stdout.write(line.decode(errors="replace"))
        sys.stdout.flush()


def die_with_parent(parent_pid: int) -> Callable[[], None] | None:
    """A preexec_fn: the child gets SIGTERM when `parent_pid` dies (Linux; None elsewhere)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # loaded before fork: the child only calls into it

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec
