"""The encoder's batcher takes images of concurrent requests as one batch; its cache is bounded."""

from __future__ import annotations

import asyncio

import torch

from dsi.model.vit import TINY_VISION, encode_images, init_vision_weights
from dsi.roles.encoder.batcher import ImageBatcher
from dsi.roles.encoder.cache import EmbedsCache


async def test_concurrent_requests_share_a_batch_and_get_their_own_embeddings():
    w = init_vision_weights(TINY_VISION)
    gen = torch.Generator().manual_seed(0)
    ims = [torch.rand(3, 28 * (i + 1), 28, generator=gen) for i in range(4)]
    batcher = ImageBatcher(TINY_VISION, w, max_batch=16)
    batcher.start()
    try:
        out = await asyncio.gather(
            batcher.encode([ims[0]]), batcher.encode(ims[1:3]), batcher.encode([ims[3]])
        )
    finally:
        await batcher.close()
    assert batcher.batches == 1 and batcher.images_encoded == 4 and batcher.queued_pixels == 0
    got = [out[0][0], *out[1], out[2][0]]
    for im, e in zip(ims, got, strict=True):
        assert torch.equal(e, encode_images(TINY_VISION, w, [im])[0])


def test_the_cache_evicts_the_least_recently_used():
    cache = EmbedsCache(capacity_bytes=3 * 64 * 4)
    for key in (b"a", b"b", b"c"):
        cache.put(key, torch.zeros(64))
    cache.get(b"a")
    cache.put(b"d", torch.zeros(64))
    assert cache.get(b"b") is None and cache.get(b"a") is not None and len(cache) == 3
