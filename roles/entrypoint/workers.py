"""Extra HTTP worker processes of one entrypoint role, on the role's HTTP port (SO_REUSEPORT).

    role process (worker 0)                       worker process i (workers.main)
    EntrypointActor: GatewayServing "<id>"        GatewayServing "<id>.w<i>"
      + ActorServer, heartbeats (registered)      (not registered: it answers HTTP only)
            |-- stdin: pickled (name, options, node, seat) -->|
            |<-- stdout: "READY" once listening ---------------|
            |-- stdin closed (role stops or dies) ------------>|  drain -> close -> exit 0
                                                   (SIGTERM / SIGINT: the same)

Every worker is a whole gateway: it learns the instances from the controller, asks the balancers
and follows the kvstore by itself, under its own peer id. The kernel spreads new connections
over the listeners; a connection stays with its worker. What the workers share is in their
seats (dsi.roles.entrypoint.seat): the API keys' slot table, so a key's limit holds over all of
them, and the sockets by which the one a scrape reaches gathers every worker's /metrics.

A worker whose stdin closes drains (at most ``drain_timeout_s``) and stops, so none outlives
its role, even one that was killed. A worker that exits while its role serves is started again
(after 0.5 s, doubling to 30 s while the restarts keep failing), once the key slots it held
are freed; ``restarts`` counts them. A worker logs as its role does (``[logging]``), naming
itself as the record's role.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import signal
import sys

import uvloop

from dsi.config import EntrypointOptions, NodeConfig
from dsi.logs import setup_logging
from dsi.roles.entrypoint.key_slots import SharedSlots
from dsi.roles.entrypoint.seat import WorkerSeat
from dsi.roles.entrypoint.serving import GatewayServing

log = logging.getLogger(__name__)

_READY = b"READY\n"
_RESTART_FIRST_S, _RESTART_MAX_S = 0.5, 30.0
_START_WAIT_S = 120.0  # a worker loads the recipe (tokenizer) before it listens
_STOP_WAIT_S = 10.0  # beyond the drain: the worker closes its connections


class WorkerStartError(Exception):
    """A worker process exited or stayed silent before it listened; the message says which."""


class HttpWorkers:
    """The worker processes ``<name>.w1`` .. ``<name>.w<count - 1>`` of one entrypoint role, in
    ``seats[1:]``; ``slots``: the role's key slot table, whose rows of exited workers are freed."""

    def __init__(
        self,
        name: str,
        options: EntrypointOptions,
        node: NodeConfig,
        seats: list[WorkerSeat],
        slots: SharedSlots,
    ) -> None:
        self.seats = seats[1:]
        self.names = [f"{name}.w{seat.index}" for seat in self.seats]
        self._options = options
        self._node = node
        self._slots = slots
        self._procs: list[asyncio.subprocess.Process] = []
        self._watchers: list[asyncio.Task] = []
        self.restarts = 0

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self._procs]

    async def start(self) -> None:
        """Start every worker and wait until each listens; on a failure, stop them all and raise.
        Then watch them: one that exits is started again."""
        try:
            for i in range(len(self.names)):
                self._procs.append(await self._spawn(i))
            for name, proc in zip(self.names, self._procs, strict=True):
                await self._wait_ready(name, proc)
        except BaseException:
            await self.stop()
            raise
        loop = asyncio.get_running_loop()
        self._watchers = [
            loop.create_task(self._watch(i), name=f"watch {name}") for i, name in enumerate(self.names)
        ]

    async def _watch(self, index: int) -> None:
        """Start worker ``index`` again whenever it exits, backing off while restarts fail."""
        name, delay = self.names[index], _RESTART_FIRST_S
        while True:
            code = await self._procs[index].wait()
            self._slots.clear(self.seats[index].index)  # what it held is given back by no one else
            log.error("HTTP worker %s exited (%s); starting it again in %.1f s", name, code, delay)
            await asyncio.sleep(delay)
            proc = await self._spawn(index)
            self._procs[index] = proc
            try:
                await self._wait_ready(name, proc)
            except WorkerStartError as exc:
                log.error("%s", exc)
                delay = min(2 * delay, _RESTART_MAX_S)
                if proc.returncode is None:
                    proc.kill()
                continue
            self.restarts += 1
            delay = _RESTART_FIRST_S
            log.info("HTTP worker %s listens again (pid %d)", name, proc.pid)

    async def _spawn(self, index: int) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import sys; from dsi.roles.entrypoint.workers import main; sys.exit(main())",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert proc.stdin is not None
        proc.stdin.write(pickle.dumps((self.names[index], self._options, self._node, self.seats[index])))
        await proc.stdin.drain()
        return proc

    @staticmethod
    async def _wait_ready(name: str, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), _START_WAIT_S)
        except TimeoutError:
            raise WorkerStartError(
                f"HTTP worker {name} did not listen within {_START_WAIT_S:.0f} s"
            ) from None
        if line != _READY:
            raise WorkerStartError(f"HTTP worker {name} exited before it listened (exit {await proc.wait()})")

    def begin_stop(self) -> None:
        """Close every worker's stdin: each drains, then exits; none is started again."""
        for watcher in self._watchers:
            watcher.cancel()
        for proc in self._procs:
            if proc.stdin is not None:
                proc.stdin.close()

    async def stop(self) -> None:
        """``begin_stop``, then wait for every worker to exit: killed when one takes more than
        ``drain_timeout_s`` + 10 s."""
        self.begin_stop()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        self._watchers.clear()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._options.drain_timeout_s + _STOP_WAIT_S
        for proc in self._procs:
            try:
                await asyncio.wait_for(proc.wait(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                proc.kill()
                await proc.wait()
        self._procs.clear()


async def _serve_worker(name: str, options: EntrypointOptions, node: NodeConfig, seat: WorkerSeat) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    serving = GatewayServing(name, options, node, seat)
    await serving.start()
    try:
        sys.stdout.buffer.write(_READY)
        sys.stdout.buffer.flush()
        stdin = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
        stdin_closed = loop.create_task(stdin.read())  # what is left after the pickle: nothing, then EOF
        stopped = loop.create_task(stop.wait())
        await asyncio.wait((stdin_closed, stopped), return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        stdin_closed.cancel()
        await serving.drain()
    finally:
        await serving.close()


def main() -> int:
    name, options, node, seat = pickle.load(sys.stdin.buffer)
    setup_logging(node.logging.format, node.logging.level, role=name)
    uvloop.run(_serve_worker(name, options, node, seat))
    return 0
