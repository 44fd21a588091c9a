"""GatewayServing: one gateway's whole stack in one process, from its node config to an HTTP
listener: decode pool (controller + balancers), prefix lookup (kvstore index), recipe, API keys,
metrics and the aiohttp site.

    start:  ZeroMQ context -> DecodePool -> PrefixLookup -> Gateway [-> WorkerLink] -> HTTP listener
    drain:  /health 503 "draining", new requests 503; wait for the requests in flight
            (at most ``drain_timeout_s``)
    close:  HTTP listener (what is still in flight is cut) [-> WorkerLink] -> DecodePool
            -> PrefixLookup -> context [-> key slot table]

The entrypoint actor runs one; each extra HTTP worker process runs one more on the same port
(``reuse_port``; see dsi.roles.entrypoint.workers). With a ``WorkerSeat`` (``http_workers`` > 1)
the API keys are the seat's, counted in the role's shared slot table, and /metrics answers
for every worker (dsi.roles.entrypoint.worker_link).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import zmq.asyncio
from aiohttp import web

from dsi.config import EntrypointOptions, NodeConfig
from dsi.kvcache.hashchain import HashChain
from dsi.model.family import served_config
from dsi.model.vision_config import VisionConfig, vision_config_of
from dsi.recipe import ModelTable, ModelVersion, Recipe, ServedModel
from dsi.recipe.images import ImageLimits
from dsi.recipe.vision_prompt import VisionSpec
from dsi.roles.curve import client_keys
from dsi.roles.entrypoint.app import make_app, start_http
from dsi.roles.entrypoint.auth import ApiKeys
from dsi.roles.entrypoint.backends import DecodePool
from dsi.roles.entrypoint.encoders import EncoderPool
from dsi.roles.entrypoint.gateway import Gateway
from dsi.roles.entrypoint.key_slots import SharedSlots
from dsi.roles.entrypoint.metrics import Metrics
from dsi.roles.entrypoint.prefix import PrefixLookup
from dsi.roles.entrypoint.prepare import Preparer
from dsi.roles.entrypoint.seat import WorkerSeat
from dsi.roles.entrypoint.worker_link import WorkerLink
from dsi.transport.sockets import peers_context
from dsi.vllm.wiring import BLOCK_SIZE as VLLM_BLOCK_SIZE

if TYPE_CHECKING:
    from dsi.model.family import AnyConfig

log = logging.getLogger(__name__)


class GatewayServing:
    """``name``: the peer id this gateway gives the controller, balancers and kvstore, and the
    worker id its /health and /metrics name (``X-Dsi-Worker``). ``seat``: its place among the
    role's HTTP workers (None: the only one)."""

    def __init__(
        self, name: str, options: EntrypointOptions, node: NodeConfig, seat: WorkerSeat | None = None
    ) -> None:
        self.name = name
        self.options = options
        self.node = node
        self.seat = seat
        self.gateway: Gateway | None = None
        self._slots: SharedSlots | None = None
        self._link: WorkerLink | None = None
        self._pool: DecodePool | None = None
        self._prefix: PrefixLookup | None = None
        self._encoders: EncoderPool | None = None
        self._ctx: zmq.asyncio.Context | None = None
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        """Everything up to a listening HTTP port; on a failure, what was started is closed."""
        try:
            await self._start()
        except BaseException:
            await self.close()
            raise

    async def _start(self) -> None:
        node, opts = self.node, self.options
        self._ctx = peers_context()  # a Peer per engine instance
        keys = client_keys(node.security)
        self._pool = pool = DecodePool(
            node.cluster.controller,
            self._ctx,
            keys=keys,
            peer_id=self.name,
            reroute_wait_s=opts.reroute_wait_s,
            balancers=node.balancer_addresses,
            balancer_timeout_s=opts.balancer_timeout_s,
            route_mode=opts.route_mode,
            route_table_ttl_s=opts.route_table_ttl_s,
        )
        await pool.start()
        m = node.model
        # Another family's directory is read (imported from [model] gguf on first start).
        shape = await asyncio.get_running_loop().run_in_executor(None, served_config, m.dir, m.config, m.gguf)
        vision = vision_config_of(node.model.config) if shape.family == "v4" else None
        if vision is not None:
            self._encoders = EncoderPool(node.cluster.controller, self._ctx, keys=keys, peer_id=self.name)
            await self._encoders.start()
        recipe = served_recipe(node, shape, self._vision_spec(vision))
        # The engine's page hashes: the chain of its model config under cluster.root_seed.
        self._prefix = prefix = PrefixLookup(
            HashChain.of(shape, node.cluster.root_seed),
            node.cluster.controller,
            self._ctx,
            keys=keys,
            peer_id=self.name,
            vllm_model=node.model.name,  # the name vLLM roles version their chain under
            vllm_block_size=VLLM_BLOCK_SIZE,
        )
        await prefix.start()
        self.gateway = Gateway(
            pool,
            self._api_keys(),
            Metrics(),
            Preparer(recipe, shape.max_context, node.kvcache.hit_policy),
            prefix,
            keep=shape.keep,
            rings=bool(shape.ring),
            slow_reader_timeout_s=opts.slow_reader_timeout_s,
            encoders=self._encoders,
            prepare_in_thread=vision is not None and opts.fetch_image_urls,
            worker=self.name,
        )
        scrape = None
        if self.seat is not None:
            self._link = WorkerLink(self.seat, self.name, self.gateway.metrics.render)
            await self._link.start()
            scrape = self._link.scrape
        app = make_app(self.gateway, [node.model.name], opts.max_body_bytes, worker=self.name, scrape=scrape)
        # With one worker the port stays exclusive, so a second gateway on it is an error.
        self._runner = await start_http(app, opts.http_host, opts.http_port, reuse_port=opts.http_workers > 1)

    def _api_keys(self) -> ApiKeys:
        """The keys file's keys, or with a seat the role's keys in its shared slot table."""
        seat = self.seat
        if seat is None:
            return ApiKeys.load(self.options.api_keys_file, self.options.max_concurrency_per_key)
        self._slots = SharedSlots.attach(seat.slots_file, seat.index, seat.count, len(seat.keys))
        return ApiKeys(seat.keys, seat.open_access, self._slots)

    def _vision_spec(self, vision: VisionConfig | None) -> VisionSpec | None:
        """Image input of the served model: its encoder's shape and this gateway's image limits."""
        if vision is None:
            return None
        opts = self.options
        limits = ImageLimits(
            max_bytes=opts.max_image_bytes,
            max_images=opts.max_images,
            allow_fetch=opts.fetch_image_urls,
            fetch_allow=opts.image_fetch_allow,
        )
        return VisionSpec(vision, limits)

    @property
    def port(self) -> int:
        """The HTTP port listened on (the configured one, or the one port 0 got)."""
        assert self._runner is not None, "not started"
        return self._runner.addresses[0][1]

    async def drain(self) -> None:
        """Refuse new requests, and wait for those in flight (at most ``drain_timeout_s``)."""
        if self.gateway is None:
            return
        timeout_s = self.options.drain_timeout_s
        left = await self.gateway.drain(timeout_s)
        if left:
            log.warning(
                "%s: %d requests still in flight after %g s of draining; closing", self.name, left, timeout_s
            )

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._link is not None:
            await self._link.close()
            self._link = None
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
        if self._prefix is not None:
            await self._prefix.close()
            self._prefix = None
        if self._encoders is not None:
            await self._encoders.close()
            self._encoders = None
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None
        if self._slots is not None:
            self._slots.close()
            self._slots = None


def served_recipe(node: NodeConfig, shape: AnyConfig, vision: VisionSpec | None = None) -> Recipe:
    """The recipe of the served model: the V4 format (and DeepSeek's own names) for the V4
    shape, with image input when ``vision`` is given; for another family, its own chat template
    and tokenizer under its name only (loaded here, so that a directory the gateway cannot serve
    fails the start)."""
    name = node.model.name
    if shape.family == "v4":
        if vision is not None:
            return Recipe({name: ServedModel(name, ModelVersion.V4, vision=vision)})
        return Recipe({name: ModelVersion.V4})
    served = ServedModel(name, ModelVersion.V4, shape.max_context, template_dir=node.model.dir)
    recipe = Recipe(models=ModelTable({name: served}, official=False), default_thinking=False)
    recipe.template_for(served).control_ids()
    return recipe
