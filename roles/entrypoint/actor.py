"""EntrypointActor: the API gateway role.

On start it loads the recipe (tokenizer, model table), learns the engine instances from the
controller, connects to the balancers (``[cluster] balancers``; with none it routes by itself),
starts following the kvstore's index (a CHECK replica, for prefix hits; see
dsi.roles.entrypoint.prefix) and serves the HTTP API on its ``http`` address (see
dsi.roles.entrypoint.app). With ``http_workers = N`` it also starts N - 1 worker processes that
serve the same port (see dsi.roles.entrypoint.workers), after it read the API keys and made the
table of their slots that every worker counts in (see dsi.roles.entrypoint.seat).

    stop:  /health 503 "draining" and new requests 503 in every worker at once (``stopping``,
           before the Goodbye to the controller)
           --> each worker's requests in flight finish (it waits at most drain_timeout_s)
           --> its listener closes and it exits (one with nothing in flight at once: the
               listeners still open take its new connections)
           --> the role's own listener closes --> the slot table is removed
"""

from __future__ import annotations

import asyncio
import os
import secrets
from dataclasses import replace

from dsi.config import EntrypointOptions, NodeConfig
from dsi.messages.control import Load
from dsi.roles.entrypoint.auth import ApiKeys
from dsi.roles.entrypoint.gateway import Gateway
from dsi.roles.entrypoint.key_slots import SharedSlots
from dsi.roles.entrypoint.seat import WorkerSeat
from dsi.roles.entrypoint.serving import GatewayServing
from dsi.roles.entrypoint.workers import HttpWorkers
from dsi.roles.role import RoleActor


class EntrypointActor(RoleActor):
    def __init__(self, name: str, options: EntrypointOptions, node: NodeConfig) -> None:
        super().__init__(name)
        self.options = options
        self.node = node
        self.http_host = options.http_host
        self.http_port = options.http_port
        self.gateway: Gateway | None = None
        self._serving: GatewayServing | None = None
        self.workers: HttpWorkers | None = None
        self._slots: SharedSlots | None = None  # the role's key slot table, with several workers

    async def on_start(self) -> None:
        try:
            await self._start()
        except BaseException:
            await self._close()
            raise
        await super().on_start()

    async def _start(self) -> None:
        seats = self._seats() if self.options.http_workers > 1 else []
        self._serving = GatewayServing(self.name, self.options, self.node, seats[0] if seats else None)
        await self._serving.start()
        self.gateway = self._serving.gateway
        if seats and self._slots is not None:
            # Port 0 was bound by worker 0 just now: the others share the port it got.
            shared = replace(self.options, http_port=self._serving.port)
            self.workers = HttpWorkers(self.name, shared, self.node, seats, self._slots)
            await self.workers.start()

    def _seats(self) -> list[WorkerSeat]:
        """Every worker's seat: the keys read once, their slot table, the workers' socket tag."""
        keys = ApiKeys.load(self.options.api_keys_file, self.options.max_concurrency_per_key)
        count = self.options.http_workers
        self._slots = SharedSlots.create(count, len(keys.entries))
        tag = f"{os.getpid()}-{secrets.token_hex(4)}"
        return [
            WorkerSeat(i, count, tag, self._slots.name, keys.entries, keys.open_access) for i in range(count)
        ]

    def stopping(self) -> None:
        """/health and new requests turn 503 in every worker now, before the Goodbye."""
        if self.gateway is not None:
            self.gateway.begin_drain()
        if self.workers is not None:
            self.workers.begin_stop()

    async def on_stop(self) -> None:
        await super().on_stop()
        # Every worker drains at the same time: the stopped workers' stdin closes at once.
        draining = [self._serving.drain()] if self._serving is not None else []
        if self.workers is not None:
            draining.append(self.workers.stop())
        await asyncio.gather(*draining)
        await self._close()

    async def _close(self) -> None:
        if self.workers is not None:
            await self.workers.stop()
            self.workers = None
        if self._serving is not None:
            await self._serving.close()
            self._serving = None
        if self._slots is not None:
            self._slots.close()
            self._slots = None

    def load(self) -> Load:
        """The role's requests in flight: every worker's (as the slot table counts them), or
        with one worker its gateway's."""
        if self._slots is not None:
            running = self._slots.total()
        else:
            running = self.gateway.metrics.in_flight if self.gateway is not None else 0
        return Load(running=running, inbox=self.inbox_depth)
