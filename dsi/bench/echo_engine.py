"""An instant decode instance: the real decode role's messages, no engine behind them.

``EchoDecodeActor`` registers with the controller as a ``decode`` instance (heartbeats, Load)
and answers every colocated ``Generate`` at once with a stream of one-token ``TokenChunk``
items: ``ids`` cut to the request's ``max_tokens``, the last one finished ``length``. What a
request through it costs is the gateway, the routing and the messaging: the entrypoint's
HTTP + recipe, its ``DecodePool`` pick, the ZeroMQ stream and the actor runtime on both ends.

``serve_echo_roles`` runs roles of a node config in this process with every decode role
replaced by an ``EchoDecodeActor`` (``dsi bench route`` runs the controller that way).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence

from dsi.actor import handles
from dsi.config import NodeConfig, RoleConfig
from dsi.messages.control import Load
from dsi.messages.gateway import Abort, Generate, TokenChunk
from dsi.roles.host import RoleHost
from dsi.roles.kinds import make_actor
from dsi.roles.role import RoleActor


class EchoDecodeActor(RoleActor):
    """A decode instance whose every request gets ``ids`` (cut to ``max_tokens``), one per chunk,
    with no wait between chunks. ``served``: requests answered to the end; ``aborted``: streams
    the entrypoint closed early or aborted."""

    def __init__(self, name: str, ids: Sequence[int]) -> None:
        super().__init__(name)
        if not ids:
            raise ValueError("an echo decode needs at least one output id")
        self.ids = list(ids)
        self.streams = 0
        self.served = 0
        self.aborted = 0

    @handles
    async def generate(self, msg: Generate) -> AsyncIterator[TokenChunk]:
        n = max(1, min(msg.sampling.max_tokens, len(self.ids)))
        prompt = len(msg.token_ids)
        self.streams += 1
        try:
            for i in range(n - 1):
                yield TokenChunk(msg.request_id, [self.ids[i]], "", prompt)
            yield TokenChunk(msg.request_id, [self.ids[n - 1]], "length", prompt)
            self.served += 1
        except (GeneratorExit, asyncio.CancelledError):
            self.aborted += 1
            raise
        finally:
            self.streams -= 1

    @handles
    async def abort(self, msg: Abort) -> None:
        self.aborted += 1

    def load(self) -> Load:
        return Load(running=self.streams, inbox=self.inbox_depth)


def echo_factory(ids: Sequence[int]) -> Callable[[RoleConfig, NodeConfig], RoleActor]:
    """An actor factory for RoleHost: decode roles get an EchoDecodeActor, the others their own."""

    def make(role: RoleConfig, node: NodeConfig) -> RoleActor:
        return EchoDecodeActor(role.id, ids) if role.kind == "decode" else make_actor(role, node)

    return make


async def serve_echo_roles(cfg: NodeConfig, role_ids: Sequence[str], ids: Sequence[int]) -> RoleHost:
    """Start ``role_ids`` of ``cfg`` here, decode roles as echoes; the caller stops the host."""
    host = RoleHost(cfg, role_ids, make=echo_factory(ids))
    await host.start()
    return host
