"""EncoderPool: where a request's images are encoded.

The encoder instances come from the controller (an ``InstancePool`` of role "encoder"). A
request's images go to the serving encoder with the fewest queued pixels (``route_vision``):
what the encoder last reported in its heartbeat plus the pixels this gateway has sent it and
not yet had answered. The encoder keeps the embeddings; the request then names it
(``Generate.encoder``) and the prefill pulls them over the data plane.
"""

from __future__ import annotations

from collections.abc import Sequence

import zmq.asyncio

from dsi.balance.load import InstanceLoad
from dsi.balance.load import NoInstance as NoBalancedInstance
from dsi.balance.vision import route_vision
from dsi.messages.blob import Blob
from dsi.messages.vision import EncodeImages, ImagePixels, ImagesEncoded
from dsi.recipe.images import DecodedImage
from dsi.roles.entrypoint.backends import InstancePool, NoInstance
from dsi.transport.security import CurveKeys


class EncoderPool:
    def __init__(
        self,
        controller: str,
        ctx: zmq.asyncio.Context,
        *,
        keys: CurveKeys | None = None,
        peer_id: str = "entrypoint",
        timeout_s: float = 60.0,
    ) -> None:
        self.instances = InstancePool(controller, ctx, role="encoder", keys=keys, peer_id=peer_id)
        self.timeout_s = timeout_s
        self._sent: dict[str, int] = {}  # instance id -> pixels sent and not answered yet
        self.images = 0  # images encoded through this pool

    async def start(self) -> None:
        await self.instances.start()

    async def close(self) -> None:
        await self.instances.close()

    async def encode(self, request_id: str, images: Sequence[DecodedImage]) -> str:
        """Have an encoder encode ``images``; returns its control address (where they are kept).
        NoInstance when no encoder serves."""
        pixels = sum(im.num_pixels for im in images)
        serving = {inst.info.instance_id: inst for inst in self.instances.serving()}
        loads = [
            InstanceLoad(
                id=i,
                role="encoder",
                queued_pixels=inst.info.load.queued_pixels + self._sent.get(i, 0),
            )
            for i, inst in serving.items()
        ]
        try:
            chosen = serving[route_vision(max(1, pixels), loads).instance]
        except NoBalancedInstance:
            raise NoInstance("no serving encoder instance") from None
        iid = chosen.info.instance_id
        self._sent[iid] = self._sent.get(iid, 0) + pixels
        try:
            msg = EncodeImages(
                request_id,
                [ImagePixels(im.digest, im.height, im.width, Blob(im.pixels)) for im in images],
            )
            answer: ImagesEncoded = await chosen.peer.ask(msg, timeout=self.timeout_s)
        finally:
            self._sent[iid] -= pixels
        if answer.tokens != [im.tokens for im in images]:
            raise NoInstance(
                f"encoder {iid} gave {answer.tokens} embedding rows, the prompt has {[im.tokens for im in images]}"
            )
        self.images += len(images)
        return chosen.info.address
