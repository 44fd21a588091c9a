"""Benchmark servers in child processes, and the CPU time a process has used.

``ServerProcess`` starts ``target(conn, *args)`` in a spawned child. The target listens, then
calls ``serve_until_terminated(conn, port)``: the port goes to the parent, and each later
message from the parent is answered with the child's CPU seconds, until the parent terminates
it. ``process_cpu_s`` reads any process's CPU seconds (a router started as a plain subprocess);
``tree_cpu_s`` adds those of its descendants (an entrypoint's HTTP worker processes).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import time
from collections.abc import Callable
from multiprocessing.connection import Connection

PORT_WAIT_S = 60.0


async def serve_until_terminated(conn: Connection, port: int | list[int]) -> None:
    """Report ``port`` (or ports), then answer each message from the parent with this process's CPU seconds."""

    def answer() -> None:
        try:
            conn.recv()
            conn.send(time.process_time())
        except (EOFError, OSError):  # the parent is gone; it terminates this process as well
            loop.remove_reader(conn.fileno())

    loop = asyncio.get_running_loop()
    conn.send(port)
    loop.add_reader(conn.fileno(), answer)
    await asyncio.Event().wait()


class ServerProcess:
    """A serving child process started with spawn; ``port`` is what it reported once listening
    (a port number, or a list of them). Several can boot at once: only reading ``port`` waits."""

    def __init__(self, target: Callable[..., None], *args: object, wait_s: float = PORT_WAIT_S) -> None:
        mp = multiprocessing.get_context("spawn")
        here, there = mp.Pipe()
        self.process = mp.Process(target=target, args=(there, *args), daemon=True)
        self.process.start()
        there.close()
        self.conn = here
        self._name = target.__name__
        self._wait_s = wait_s
        self._port: int | list[int] | None = None

    @property
    def port(self) -> int | list[int]:
        if self._port is None:
            if not self.conn.poll(self._wait_s):
                self.stop()
                raise RuntimeError(f"{self._name} did not report its port in {self._wait_s}s")
            self._port = self.conn.recv()
        return self._port

    def cpu_s(self) -> float:
        """User + system CPU seconds of the process so far."""
        self.conn.send(None)
        if not self.conn.poll(PORT_WAIT_S):
            raise RuntimeError(f"the server on port {self.port} did not report its CPU time")
        return self.conn.recv()

    def stop(self) -> None:
        stop_process(self.process)
        self.conn.close()


def stop_process(process: multiprocessing.process.BaseProcess, grace_s: float = 5.0) -> None:
    """SIGTERM a child process, SIGKILL it if it is still alive after `grace_s` seconds, and reap it."""
    process.terminate()
    process.join(grace_s)
    if process.is_alive():
        process.kill()
        process.join()


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads) so far, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime in ticks


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of process ``pid`` and of every living descendant, from /proc. A descendant
    that exited takes its CPU time away with it, so read this while they all run."""
    total, todo = 0.0, [pid]
    while todo:
        one = todo.pop()
        try:
            total += process_cpu_s(one)
            for task in os.listdir(f"/proc/{one}/task"):
                with open(f"/proc/{one}/task/{task}/children") as f:
                    todo += [int(child) for child in f.read().split()]
        except FileNotFoundError:  # it exited while we read
            continue
    return total
