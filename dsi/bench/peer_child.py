"""One system of ``dsi bench peers`` in a child process of its own, answering run by run.

Every system (dsi's engine, transformers, vLLM) loads once in a child started in a session of
its own: on Linux with autogroup scheduling the kernel shares the CPU between sessions, so each
system gets the same share of a loaded machine whatever else runs beside the bench. The parent
interleaves the children's timed runs over one line protocol, and counts the CPU seconds of each
child's session (all its processes) per run::

    child -> {"ready": true, "load_s": 12.3, "version": "0.32.0"}     (or {"error": "..."})
    parent -> run      child -> {"tok_s": 310.2, "outputs": [[...], ...]}   one timed run
    parent -> quit (or end of input)   child exits

Each answer is one JSON line on the child's original stdout (:func:`answer_channel` moves
everything else the child prints to stderr, which goes to the child's log file).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO


@dataclass(slots=True)
class PeerRun:
    """What a child measured: tokens/s of each timed run (wall time), the CPU seconds its
    processes spent in each run, its load time (s), its version, each prompt's output tokens of
    the last run."""

    tok_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)  # CPU seconds of the child's session per run
    load_s: float = 0.0
    version: str = ""
    outputs: list[list[int]] = field(default_factory=list)


def parse_answer(line: str) -> dict | str:
    """One answer line of a child -> its JSON object, or why it is not one (an ``error`` the
    child reports, a line that is not JSON, or no line at all)."""
    if not line.strip():
        return "stopped without an answer"
    try:
        data = json.loads(line)
    except ValueError as exc:
        return f"printed an unreadable answer: {exc}"
    if not isinstance(data, dict):
        return "printed an unreadable answer: not an object"
    if "error" in data:
        return f"failed: {data['error']}"
    return data


class PeerChild:
    """A child process that speaks the protocol above; :meth:`run_once` is one timed run."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        log: Path,
        preexec: Callable[[], None] | None = None,
    ) -> None:
        self.name, self.argv, self.env, self.log = name, argv, env, log
        self.preexec = preexec  # runs in the child first (dsi.bench.pinning.pinned: its cores)
        self.run = PeerRun()
        self._proc: subprocess.Popen | None = None
        self._reader = ThreadPoolExecutor(1)

    def start(self, timeout_s: float = 1800.0) -> str | None:
        """Load; None once ready, else why not."""
        try:
            with open(self.log, "wb") as log:
                self._proc = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    env=self.env,
                    text=True,
                    start_new_session=True,
                    preexec_fn=self.preexec,
                )
        except OSError as exc:
            return f"cannot run {self.name}: {exc}"
        answer = self._answer(timeout_s)
        if isinstance(answer, str):
            return answer
        self.run.load_s, self.run.version = float(answer["load_s"]), str(answer.get("version", ""))
        return None

    def run_once(self, timeout_s: float = 1800.0) -> str | None:
        """One timed run, added to ``self.run``; None, or why it failed."""
        before = session_cpu_s(self._proc.pid) if self._proc is not None else 0.0
        try:
            self._proc.stdin.write("run\n")
            self._proc.stdin.flush()
        except (OSError, AttributeError) as exc:
            return f"{self.name} is not running: {exc}"
        answer = self._answer(timeout_s)
        if isinstance(answer, str):
            return answer
        self.run.cpu_s.append(session_cpu_s(self._proc.pid) - before)
        self.run.tok_s.append(float(answer["tok_s"]))
        self.run.outputs = answer["outputs"]
        return None

    def _answer(self, timeout_s: float) -> dict | str:
        future = self._reader.submit(self._proc.stdout.readline)
        try:
            answer = parse_answer(future.result(timeout_s))
        except FutureTimeout:
            answer = f"gave no answer in {timeout_s:.0f} s"
        return answer if isinstance(answer, dict) else f"{self.name} {answer}; see {self.log}"

    def close(self, timeout_s: float = 60.0) -> None:
        """Ask the child to quit; SIGKILL its process group (vLLM's engine core and workers too)
        after `timeout_s` or once it has exited."""
        if self._proc is not None:
            with contextlib.suppress(OSError, ValueError):
                self._proc.stdin.write("quit\n")
                self._proc.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout_s)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        self._reader.shutdown(wait=False, cancel_futures=True)


def session_cpu_s(sid: int) -> float:
    """User + system CPU seconds of the live processes of session ``sid`` (0.0 without /proc)."""
    total, tick = 0, os.sysconf("SC_CLK_TCK")
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid:  # fields after the name: state, ppid, pgrp, session, ...
            total += int(fields[11]) + int(fields[12])  # utime, stime (ticks)
    return total / tick


def answer_channel() -> TextIO:
    """In a child: the stream its answers go to (its original stdout); fd 1 goes to stderr."""
    channel = os.fdopen(os.dup(1), "w")
    sys.stdout.flush()
    os.dup2(2, 1)
    return channel


def answer(channel: TextIO, data: dict) -> None:
    channel.write(json.dumps(data) + "\n")
    channel.flush()
