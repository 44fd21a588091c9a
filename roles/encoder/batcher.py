"""ImageBatcher: images from many requests, encoded together on one worker thread.

    encode(images) --queue--> batch loop: take what is queued (up to max_batch images)
                              --> encode_images on the worker thread --> each caller's future

While a batch runs, new images queue up and form the next batch, so under load the batch
grows by itself and an idle encoder answers one image at once. ``queued_pixels`` counts the
pixels waiting or running (what the vision balancer routes by). An image's embeddings do not
depend on its batch (``dsi.model.vit`` uses the batch-invariant product).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from dsi.model.vit import VisionConfig, encode_images


@dataclass(slots=True)
class _Item:
    image: torch.Tensor  # [3, H, W] float in [0, 1]
    future: asyncio.Future


class ImageBatcher:
    def __init__(self, cfg: VisionConfig, weights: dict[str, torch.Tensor], max_batch: int = 16) -> None:
        self.cfg, self.weights, self.max_batch = cfg, weights, max_batch
        self.queued_pixels = 0
        self.images_encoded = 0
        self.batches = 0
        self._queue: deque[_Item] = deque()
        self._wake = asyncio.Event()
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="dsi-vision")
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="image-batcher")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for item in self._queue:
            if not item.future.done():
                item.future.set_exception(RuntimeError("the encoder stopped"))
        self._worker.shutdown(wait=True)

    async def encode(self, images: list[torch.Tensor]) -> list[torch.Tensor]:
        """Embeddings [tokens, lm_hidden] fp32 of each image [3, H, W], in order."""
        loop = asyncio.get_running_loop()
        items = [_Item(im, loop.create_future()) for im in images]
        for item in items:
            self._queue.append(item)
            self.queued_pixels += item.image.shape[1] * item.image.shape[2]
        self._wake.set()
        return list(await asyncio.gather(*(i.future for i in items)))

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                batch = [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]
                try:
                    out = await loop.run_in_executor(
                        self._worker, encode_images, self.cfg, self.weights, [i.image for i in batch]
                    )
                except Exception as exc:  # a bad batch fails its callers, never the loop
                    out = [exc] * len(batch)
                self.batches += 1
                for item, result in zip(batch, out, strict=True):
                    self.queued_pixels -= item.image.shape[1] * item.image.shape[2]
                    if item.future.done():
                        continue
                    if isinstance(result, Exception):
                        item.future.set_exception(result)
                    else:
                        self.images_encoded += 1
                        item.future.set_result(result)
