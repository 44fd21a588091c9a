"""Entrypoint -> encoder -> prefill: images in, embeddings out over the data plane.

    entrypoint                      encoder                                  prefill
      |-- EncodeImages(pixels) ------>|  queued; batched with other requests'
      |<-------------- ImagesEncoded -|  images; embeddings kept by digest
      |-- Handoff / Generate(images: spans + digests, encoder address) --------->|  (via the decode)
      |                               |<------------- PullEmbeds(digests, KvLease) --|  receive region
      |                               |========= data plane: [tokens, hidden] fp32 ===>|
      |                               |-- EmbedsSent ------------------------------->|  prefill with them

Pixels travel as a zero-copy frame of the control message (``Blob``); embeddings never ride a
control message. The encoder keeps embeddings by image digest for a while (bounded bytes), so a
prefill retried elsewhere can pull them again; a digest it no longer holds is ``ImagesMissing``.
"""

from __future__ import annotations

from dsi.errors import DsiError, register_error
from dsi.messages.base import Message
from dsi.messages.blob import Blob
from dsi.messages.handoff import KvLease


class ImagePixels(Message):
    """One decoded image: ``pixels`` [height, width, 3] uint8 RGB (sizes multiples of 28)."""

    digest: bytes  # 16 bytes, see dsi.recipe.images.image_digest
    height: int
    width: int
    pixels: Blob


class EncodeImages(Message):
    """Entrypoint -> encoder: encode (batched with other requests' images) and keep the results."""

    request_id: str
    images: list[ImagePixels]


class ImagesEncoded(Message):
    tokens: list[int]  # embedding rows per image, in order


class PullEmbeds(Message):
    """Prefill -> encoder: write the embeddings of ``digests`` (in order, concatenated:
    [sum of tokens, hidden] fp32) into ``lease``."""

    digests: list[bytes]
    lease: KvLease


class EmbedsSent(Message):
    rows: int


class ImagesMissing(DsiError):
    """The encoder does not hold (any more) the embeddings of an image."""

    code = "images_missing"


register_error(ImagesMissing)

VisionMsg = ImagePixels | EncodeImages | ImagesEncoded | PullEmbeds | EmbedsSent
VISION = (ImagePixels, EncodeImages, ImagesEncoded, PullEmbeds, EmbedsSent)
