"""EntrypointActor: the API gateway role.

On start it loads the recipe (tokenizer, model table), learns the engine instances from the
controller, connects to the balancers (``[cluster] balancers``; with none it routes by itself),
starts following the kvstore's index (a CHECK replica, for prefix hits; see
dsi.roles.entrypoint.prefix) and serves the HTTP API on its ``http`` address (see
dsi.roles.entrypoint.app). With ``http_workers = N`` it also starts N - 1 worker processes that
serve the same port (see dsi.roles.entrypoint.workers).
"""

from __future__ import annotations

from dataclasses import replace

from dsi.config import EntrypointOptions, NodeConfig
from dsi.messages.control import Load
from dsi.roles.entrypoint.gateway import Gateway
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

    async def on_start(self) -> None:
        self._serving = GatewayServing(self.name, self.options, self.node)
        await self._serving.start()
        self.gateway = self._serving.gateway
        if self.options.http_workers > 1:
            # Port 0 was bound by worker 0 just now: the others share the port it got.
            shared = replace(self.options, http_port=self._serving.port)
            self.workers = HttpWorkers(self.name, shared, self.node, self.options.http_workers)
            try:
                await self.workers.start()
            except BaseException:
                await self._serving.close()
                raise
        await super().on_start()

    async def on_stop(self) -> None:
        await super().on_stop()
        if self.workers is not None:
            await self.workers.stop()
        if self._serving is not None:
            await self._serving.close()

    def load(self) -> Load:
        """Worker 0's requests in flight (the other workers report to no one)."""
        running = self.gateway.metrics.in_flight if self.gateway is not None else 0
        return Load(running=running, inbox=self.inbox_depth)
