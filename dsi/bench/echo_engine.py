"""An instant decode instance: the real decode role's messages, no engine behind them.

``EchoDecodeActor`` registers with the controller as a ``decode`` instance (heartbeats, Load),
pushes a ``LoadReport`` to every balancer it is given (dsi.roles.load_report.LoadReporter: each
second and within ~5 ms of a stream starting or ending) and answers every colocated ``Generate`` at once with a stream of one-token ``TokenChunk``
items: ``ids`` cut to the request's ``max_tokens``, the last one finished ``length``. What a
request through it costs is the gateway, the routing and the messaging: the entrypoint's
HTTP + recipe, its ``DecodePool`` pick (or its ask to a balancer), the ZeroMQ stream and the
actor runtime on both ends.

``serve_echo_roles`` runs roles of a node config in this process with every decode role
replaced by an ``EchoDecodeActor`` reporting to the config's balancers (``dsi bench route``
runs the controller that way).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence

import zmq.asyncio

from dsi.actor import handles
from dsi.config import NodeConfig, RoleConfig
from dsi.messages.balancer import LoadReport
from dsi.messages.control import Load
from dsi.messages.gateway import Abort, Generate, TokenChunk
from dsi.roles.host import RoleHost
from dsi.roles.kinds import make_actor
from dsi.roles.load_report import LoadReporter
from dsi.roles.role import RoleActor

# What an echo tells the balancers it can hold: far more than a bench keeps in flight, so the
# decode policy never finds it full.
ECHO_MAX_REQUESTS = 1 << 16
ECHO_KV_CAPACITY_TOKENS = 1 << 40


class EchoDecodeActor(RoleActor):
    """A decode instance whose every request gets ``ids`` (cut to ``max_tokens``), one per chunk,
    with no wait between chunks. ``served``: requests answered to the end; ``aborted``: streams
    the entrypoint closed early or aborted; ``accepted``: streams started (load reports carry it).
    ``balancers``: where load reports go (none: no reports)."""

    def __init__(self, name: str, ids: Sequence[int], balancers: Sequence[str] = ()) -> None:
        super().__init__(name)
        if not ids:
            raise ValueError("an echo decode needs at least one output id")
        self.ids = list(ids)
        self.streams = 0
        self.served = 0
        self.aborted = 0
        self.accepted = 0
        self.started_at = time.time()
        self.balancers = tuple(balancers)
        self.reporter: LoadReporter | None = None
        self._ctx: zmq.asyncio.Context | None = None

    async def on_start(self) -> None:
        await super().on_start()
        if self.balancers:
            self._ctx = zmq.asyncio.Context()
            self.reporter = LoadReporter(self.name, self.balancers, self.load_report, self._ctx)
            await self.reporter.start()

    async def on_stop(self) -> None:
        await super().on_stop()
        if self.reporter is not None:
            self.reporter.send_now()  # state "stopping": the balancers stop routing here
            await self.reporter.stop()
        if self._ctx is not None:
            self._ctx.destroy(linger=0)

    def load_report(self) -> LoadReport:
        return LoadReport(
            self.name,
            "decode",
            self.started_at,
            self.state,
            running=self.streams,
            accepted=self.accepted,
            max_requests=ECHO_MAX_REQUESTS,
            kv_capacity_tokens=ECHO_KV_CAPACITY_TOKENS,
        )

    def _changed(self) -> None:
        if self.reporter is not None:
            self.reporter.poke()

    @handles
    async def generate(self, msg: Generate) -> AsyncIterator[TokenChunk]:
        n = max(1, min(msg.sampling.max_tokens, len(self.ids)))
        prompt = len(msg.token_ids)
        self.streams += 1
        self.accepted += 1
        self._changed()
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
            self._changed()

    @handles
    async def abort(self, msg: Abort) -> None:
        self.aborted += 1

    def load(self) -> Load:
        return Load(running=self.streams, inbox=self.inbox_depth)


def echo_factory(ids: Sequence[int]) -> Callable[[RoleConfig, NodeConfig], RoleActor]:
    """An actor factory for RoleHost: decode roles get an EchoDecodeActor reporting to the node's
    balancers, the others their own actor."""

    def make(role: RoleConfig, node: NodeConfig) -> RoleActor:
        if role.kind == "decode":
            return EchoDecodeActor(role.id, ids, node.balancer_addresses)
        return make_actor(role, node)

    return make


async def serve_echo_roles(cfg: NodeConfig, role_ids: Sequence[str], ids: Sequence[int]) -> RoleHost:
    """Start ``role_ids`` of ``cfg`` here, decode roles as echoes; the caller stops the host."""
    host = RoleHost(cfg, role_ids, make=echo_factory(ids))
    await host.start()
    return host
