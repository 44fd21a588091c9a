"""Extra HTTP worker processes of one entrypoint role, on the role's HTTP port (SO_REUSEPORT).

    role process (worker 0)                       worker process i (workers.main)
    EntrypointActor: GatewayServing "<id>"        GatewayServing "<id>.w<i>"
      + ActorServer, heartbeats (registered)      (not registered: it answers HTTP only)
            |-- stdin: pickled (name, options, node) -->|
            |<-- stdout: "READY" once listening --------|
            |-- stdin closed (role stops or dies) ----->|  close -> exit 0

Every worker is a whole gateway: it learns the instances from the controller, asks the balancers
and follows the kvstore by itself, under its own peer id. The kernel spreads new connections
over the listeners; a connection stays with its worker. A worker whose stdin closes stops, so
none outlives its role, even one that was killed.
"""

from __future__ import annotations

import asyncio
import pickle
import signal
import sys

import uvloop

from dsi.config import EntrypointOptions, NodeConfig
from dsi.roles.entrypoint.serving import GatewayServing

_READY = b"READY\n"
_START_WAIT_S = 120.0  # a worker loads the recipe (tokenizer) before it listens
_STOP_WAIT_S = 10.0


class WorkerStartError(Exception):
    """A worker process exited or stayed silent before it listened; the message says which."""


class HttpWorkers:
    """The worker processes ``<name>.w1`` .. ``<name>.w<count - 1>`` of one entrypoint role."""

    def __init__(self, name: str, options: EntrypointOptions, node: NodeConfig, count: int) -> None:
        self.names = [f"{name}.w{i}" for i in range(1, count)]
        self._options = options
        self._node = node
        self._procs: list[asyncio.subprocess.Process] = []

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self._procs]

    async def start(self) -> None:
        """Start every worker and wait until each listens; on a failure, stop them all and raise."""
        try:
            for name in self.names:
                self._procs.append(await self._spawn(name))
            for name, proc in zip(self.names, self._procs, strict=True):
                await self._wait_ready(name, proc)
        except BaseException:
            await self.stop()
            raise

    async def _spawn(self, name: str) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import sys; from dsi.roles.entrypoint.workers import main; sys.exit(main())",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert proc.stdin is not None
        proc.stdin.write(pickle.dumps((name, self._options, self._node)))
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

    async def stop(self) -> None:
        """Close every worker's stdin, then wait for it to exit (killed after a bound)."""
        for proc in self._procs:
            if proc.stdin is not None:
                proc.stdin.close()
        for proc in self._procs:
            try:
                await asyncio.wait_for(proc.wait(), _STOP_WAIT_S)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        self._procs.clear()


async def _serve_worker(name: str, options: EntrypointOptions, node: NodeConfig) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    serving = GatewayServing(name, options, node)
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
    finally:
        await serving.close()


def main() -> int:
    name, options, node = pickle.load(sys.stdin.buffer)
    uvloop.run(_serve_worker(name, options, node))
    return 0
