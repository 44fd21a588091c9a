"""Supervisor: child processes that announce ``READY`` on stdout, watched and stopped as a group.

Each child runs in its own session (so a terminal's Ctrl-C reaches only the supervisor, which
then stops the children in order) and asks the kernel for SIGTERM when the supervisor dies
(PR_SET_PDEATHSIG), so not even a SIGKILLed supervisor leaves orphans. Stopping a child sends
SIGTERM to its process group, waits `grace_s`, then sends SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

_PR_SET_PDEATHSIG = 1


class ChildFailed(Exception):
    """A child exited, or printed something else, before it was READY."""


@dataclass(slots=True)
class Child:
    name: str
    proc: asyncio.subprocess.Process

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None


class Supervisor:
    """Starts children and stops them; `grace_s` is how long SIGTERM gets before SIGKILL."""

    def __init__(self, grace_s: float = 10.0) -> None:
        self.grace_s = grace_s
        self.children: list[Child] = []
        self._pipes: set[asyncio.Task] = set()

    async def start(self, name: str, argv: Sequence[str]) -> Child:
        """Start a child; stdout is read by `wait_ready`, stderr is shared with this process."""
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            start_new_session=True,
            preexec_fn=_die_with_parent(os.getpid()),
        )
        child = Child(name, proc)
        self.children.append(child)
        return child

    async def wait_ready(self, child: Child) -> str:
        """The rest of the child's ``READY ...`` line; later stdout lines are copied to ours."""
        stdout = child.proc.stdout
        if stdout is None:
            raise ChildFailed(f"{child.name} was started without a stdout pipe")
        line = (await stdout.readline()).decode(errors="replace").rstrip("\n")
        if not line.startswith("READY"):
            code = await child.proc.wait() if not line else None
            said = f"exited with status {code}" if code is not None else f"printed {line!r}"
            raise ChildFailed(f"{child.name} (pid {child.pid}) {said} before it was READY")
        task = asyncio.get_running_loop().create_task(_copy_lines(stdout))
        self._pipes.add(task)
        task.add_done_callback(self._pipes.discard)
        return line.removeprefix("READY").strip()

    async def first_exit(self) -> Child:
        """The first child to exit (returns at once if one already has)."""
        waits = {asyncio.ensure_future(child.proc.wait()): child for child in self.children}
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()
        return waits[next(iter(done))]

    async def stop(self, children: Sequence[Child]) -> None:
        """SIGTERM every child given at once, wait, SIGKILL those still running after grace_s."""
        await asyncio.gather(*(self._stop_one(child) for child in children))

    async def close(self) -> None:
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def _stop_one(self, child: Child) -> None:
        _signal_group(child, signal.SIGTERM)
        try:
            await asyncio.wait_for(child.proc.wait(), self.grace_s)
        except TimeoutError:
            print(
                f"dsi serve: {child.name} (pid {child.pid}) ignored SIGTERM for {self.grace_s:g}s; killing it",
                file=sys.stderr,
                flush=True,
            )
            _signal_group(child, signal.SIGKILL)
            await child.proc.wait()


def _signal_group(child: Child, sig: signal.Signals) -> None:
    # An exited but unreaped child keeps its pid (and so its group id): no reuse race here.
    if child.alive:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, sig)


async def _copy_lines(stream: asyncio.StreamReader) -> None:
    while line := await stream.readline():
        sys.stdout.write(line.decode(errors="replace"))
        sys.stdout.flush()


def _die_with_parent(parent_pid: int) -> Callable[[], None] | None:
    """A preexec_fn: the child gets SIGTERM when `parent_pid` dies (Linux; None elsewhere)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # loaded before fork: the child only calls into it

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec
