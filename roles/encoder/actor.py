"""EncoderActor: one vision-encoder instance.

``EncodeImages`` (from an entrypoint): the images join the batcher's queue (batched with other
requests' images), and their embeddings are kept by digest; the answer gives each image's
number of embedding rows. ``PullEmbeds`` (from a prefill): the embeddings of the named images,
concatenated, are written into the prefill's receive region over the data plane (never inside a
control message). ``Load.queued_pixels``: pixels waiting or being encoded.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import torch

from dsi.actor import handles
from dsi.config import EncoderOptions, ModelConfig, NodeConfig, RoleAddresses, RoleConfig, addresses_of
from dsi.config.addresses import LOOPBACK
from dsi.messages.control import Load
from dsi.messages.vision import EmbedsSent, EncodeImages, ImagesEncoded, ImagesMissing, PullEmbeds
from dsi.model.vit import image_tensor
from dsi.roles.curve import server_keys
from dsi.roles.data_plane import start_data_plane
from dsi.roles.encoder.batcher import ImageBatcher
from dsi.roles.encoder.cache import EmbedsCache
from dsi.roles.engine_role import lease_target
from dsi.roles.role import RoleActor
from dsi.transport.kv import DataPlane
from dsi.transport.security import CurveKeys

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EncoderSettings:
    options: EncoderOptions
    model: ModelConfig
    data_backend: str = "tcp"
    # Where the data plane binds and the host its targets name (dsi.config.addresses).
    addresses: RoleAddresses = LOOPBACK
    keys: CurveKeys | None = None  # [security]: the data plane's tcp links prove them and are sealed

    @classmethod
    def of(cls, role: RoleConfig, node: NodeConfig) -> EncoderSettings:
        assert isinstance(role.options, EncoderOptions)
        return cls(
            role.options,
            node.model,
            node.data_plane.backend,
            addresses_of(role, node),
            server_keys(node.security),
        )


class EncoderActor(RoleActor):
    kind = "encoder"

    def __init__(self, name: str, settings: EncoderSettings) -> None:
        super().__init__(name)
        self.settings = settings
        self.batcher: ImageBatcher | None = None
        self.cache = EmbedsCache(settings.options.cache_bytes)
        self.data: DataPlane | None = None
        self.served = 0  # embeddings sent to prefills

    async def on_start(self) -> None:
        cfg, weights = await asyncio.get_running_loop().run_in_executor(None, self._load)
        self.batcher = ImageBatcher(cfg, weights, self.settings.options.max_batch_images)
        self.batcher.start()
        self.data = await start_data_plane(
            self.settings.data_backend, self.settings.addresses, keys=self.settings.keys
        )
        log.info("%s: vision encoder ready (%d layers, hidden %d)", self.name, cfg.n_layers, cfg.hidden)
        await super().on_start()

    async def on_stop(self) -> None:
        await super().on_stop()
        if self.batcher is not None:
            await self.batcher.close()
        if self.data is not None:
            await self.data.close()

    def _load(self) -> tuple:
        from dsi.model.prepare import ensure_model, ensure_vision
        from dsi.model.vit import load_vision

        m = self.settings.model
        directory = ensure_model(m.dir, m.config)
        ensure_vision(directory, m.config)
        return load_vision(directory)

    def load(self) -> Load:
        queued = self.batcher.queued_pixels if self.batcher is not None else 0
        return Load(inbox=self.inbox_depth, queued_pixels=queued)

    @handles(concurrent=True)
    async def encode_images(self, msg: EncodeImages) -> ImagesEncoded:
        assert self.batcher is not None
        todo = [im for im in msg.images if self.cache.get(im.digest) is None]
        tensors = [image_tensor(im.pixels.numpy().reshape(im.height, im.width, 3)) for im in todo]
        for im, embeds in zip(todo, await self.batcher.encode(tensors), strict=True):
            self.cache.put(im.digest, embeds)
        tokens = []
        for im in msg.images:
            embeds = self.cache.get(im.digest)
            if embeds is None:
                raise ImagesMissing(f"{self.name}: the embeddings of an image were evicted at once")
            tokens.append(embeds.shape[0])
        return ImagesEncoded(tokens)

    @handles(concurrent=True)
    async def pull_embeds(self, msg: PullEmbeds) -> EmbedsSent:
        assert self.data is not None
        found = [self.cache.get(d) for d in msg.digests]
        if any(t is None for t in found):
            raise ImagesMissing(
                f"{self.name} holds no embeddings for {sum(t is None for t in found)} image(s)"
            )
        rows = torch.cat(found)  # type: ignore[arg-type]
        if rows.nbytes != msg.lease.nbytes:
            raise ImagesMissing(
                f"{self.name}: the images have {rows.nbytes} bytes; the lease takes {msg.lease.nbytes}"
            )
        await self.data.send(
            lease_target(msg.lease), [memoryview(rows.numpy()).cast("B")], timeout_s=msg.lease.expires_in_s
        )
        self.served += 1
        return EmbedsSent(rows.shape[0])
