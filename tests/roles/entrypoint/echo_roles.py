"""The controller and decode roles of a node config in one process, every decode an echo that
sends one token each ``step_s`` seconds (dsi.bench.echo_engine), for tests of the entrypoint's
own processes: no engine to wait for, and streams that last as long as a test needs.

    python -m tests.roles.entrypoint.echo_roles CONFIG STEP_S

prints ``READY`` once the roles serve and stops them on SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator, Sequence

import uvloop

from dsi.actor import handles
from dsi.bench.echo_engine import EchoDecodeActor
from dsi.bench.recipe import stream_ids
from dsi.config import NodeConfig, RoleConfig, load_config
from dsi.messages.gateway import Generate, TokenChunk
from dsi.roles.host import RoleHost
from dsi.roles.kinds import make_actor
from dsi.roles.role import RoleActor

ECHO_TOKENS = 512  # the longest answer an echo gives


class PacedEcho(EchoDecodeActor):
    """An echo decode whose every token comes ``step_s`` seconds after the one before."""

    def __init__(self, name: str, ids: Sequence[int], step_s: float) -> None:
        super().__init__(name, ids)
        self.step_s = step_s

    @handles
    async def generate(self, msg: Generate) -> AsyncIterator[TokenChunk]:
        async for chunk in super().generate(msg):
            await asyncio.sleep(self.step_s)
            yield chunk


async def serve(config: str, step_s: float) -> None:
    cfg = load_config(config)
    ids = stream_ids(ECHO_TOKENS)

    def make(role: RoleConfig, node: NodeConfig) -> RoleActor:
        return PacedEcho(role.id, ids, step_s) if role.kind == "decode" else make_actor(role, node)

    host = RoleHost(cfg, [r.id for r in cfg.roles if r.kind in ("controller", "decode")], make=make)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await host.start()
    try:
        print("READY", flush=True)
        await stop.wait()
    finally:
        await host.stop()


if __name__ == "__main__":
    uvloop.run(serve(sys.argv[1], float(sys.argv[2])))
