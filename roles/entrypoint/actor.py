"""EntrypointActor: the API gateway role.

On start it loads the recipe (tokenizer, model table), learns the engine instances from the
controller, connects to the balancers (``[cluster] balancers``; with none it routes by itself),
starts following the kvstore's index (a CHECK replica, for prefix hits; see
dsi.roles.entrypoint.prefix) and serves the HTTP API on its ``http`` address (see
dsi.roles.entrypoint.app).
"""

from __future__ import annotations

import zmq.asyncio
from aiohttp import web

from dsi.config import EntrypointOptions, NodeConfig
from dsi.kvcache.hashchain import HashChain
from dsi.messages.control import Load
from dsi.model.config import get_config
from dsi.recipe import ModelVersion, Recipe
from dsi.roles.curve import client_keys
from dsi.roles.entrypoint.app import make_app, start_http
from dsi.roles.entrypoint.auth import ApiKeys
from dsi.roles.entrypoint.backends import DecodePool
from dsi.roles.entrypoint.gateway import Gateway
from dsi.roles.entrypoint.metrics import Metrics
from dsi.roles.entrypoint.prefix import PrefixLookup
from dsi.roles.entrypoint.prepare import Preparer
from dsi.roles.role import RoleActor


class EntrypointActor(RoleActor):
    def __init__(self, name: str, options: EntrypointOptions, node: NodeConfig) -> None:
        super().__init__(name)
        self.options = options
        self.node = node
        self.http_host = options.http_host
        self.http_port = options.http_port
        self.gateway: Gateway | None = None
        self._ctx: zmq.asyncio.Context | None = None
        self._runner: web.AppRunner | None = None

    async def on_start(self) -> None:
        node, opts = self.node, self.options
        self._ctx = zmq.asyncio.Context()
        pool = DecodePool(node.cluster.controller, self._ctx, keys=client_keys(node.security), peer_id=self.name,
                          reroute_wait_s=opts.reroute_wait_s, balancers=node.balancer_addresses,
                          balancer_timeout_s=opts.balancer_timeout_s)
        await pool.start()
        shape = get_config(node.model.config)
        # The engine's page hashes: the chain of its model config under cluster.root_seed.
        prefix = PrefixLookup(HashChain.of(shape, node.cluster.root_seed), node.cluster.controller, self._ctx,
                              keys=client_keys(node.security), peer_id=self.name)
        await prefix.start()
        recipe = Recipe({node.model.name: ModelVersion.V4})
        preparer = Preparer(recipe, shape.max_context, node.kvcache.hit_policy)
        keys = ApiKeys.load(opts.api_keys_file, opts.max_concurrency_per_key)
        self.gateway = Gateway(pool, keys, Metrics(), preparer, prefix, keep=shape.keep,
                               slow_reader_timeout_s=opts.slow_reader_timeout_s)
        app = make_app(self.gateway, [node.model.name], opts.max_body_bytes)
        self._runner = await start_http(app, self.http_host, self.http_port)
        await super().on_start()

    async def on_stop(self) -> None:
        await super().on_stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.gateway is not None:
            await self.gateway.pool.close()
            if self.gateway.prefix is not None:
                await self.gateway.prefix.close()
        if self._ctx is not None:
            self._ctx.destroy(linger=0)

    def load(self) -> Load:
        running = self.gateway.metrics.in_flight if self.gateway is not None else 0
        return Load(running=running, inbox=self.inbox_depth)
