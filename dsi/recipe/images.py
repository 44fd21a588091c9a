"""Image input: a request's image (a ``data:`` URL, or an ``http(s)`` URL when fetching is on)
-> RGB pixels of bounded size, resized for the vision encoder, and a content hash.

    data:image/png;base64,....  --base64 (<= max_bytes)--> bytes
        --Pillow header: format in FORMATS, declared W x H in [1, max_source_pixels]--> decode
        --first frame, RGB--> resize (aspect kept) to multiples of 28 px, <= max_pixels in all
        --> DecodedImage(pixels [H, W, 3] uint8, digest = xxh3_128 of size and pixels)

Every failure is a RequestError 400 (``invalid_image``) that names the request field; nothing is
decoded before the declared size is checked, so a 50,000 x 50,000 PNG of a few bytes costs
nothing. ``http(s)`` URLs are refused unless ``ImageLimits.allow_fetch`` (off by default); they
are then fetched from public addresses only, within ``max_bytes`` and ``fetch_timeout_s``
(dsi.recipe.image_fetch). The fetch blocks its caller: the gateway prepares requests in a
worker thread when fetching is on.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import re
from dataclasses import dataclass

import numpy as np
import xxhash
from PIL import Image, UnidentifiedImageError

from dsi.model.vision_config import VisionConfig
from dsi.recipe.errors import RequestError
from dsi.recipe.image_fetch import FetchLimits, ImageFetchError, IPNetwork, fetch_image

FORMATS = ("PNG", "JPEG", "GIF", "WEBP")
_DATA_URL = re.compile(
    r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^;,]*)*?);base64,(?P<data>.*)$", re.S
)


@dataclass(slots=True, frozen=True)
class ImageLimits:
    """Bounds on one image. ``max_bytes``: encoded bytes; ``max_source_pixels``: the declared
    width x height before decoding; ``max_images``: per request. ``allow_fetch``: http(s) URLs
    are fetched, within ``fetch_timeout_s`` seconds, from public addresses and the networks of
    ``fetch_allow`` only."""

    max_bytes: int = 8 << 20
    max_source_pixels: int = 40_000_000
    max_images: int = 16
    allow_fetch: bool = False
    fetch_timeout_s: float = 10.0
    fetch_allow: tuple[IPNetwork, ...] = ()


@dataclass(slots=True, frozen=True)
class DecodedImage:
    """An image as the vision encoder takes it: ``pixels`` is [height, width, 3] uint8 RGB,
    row-major; height and width are multiples of the encoder's unit (28 px)."""

    pixels: bytes
    height: int
    width: int
    digest: bytes  # 16 bytes: xxh3_128 of the size and pixels (the image's block-hash extra key)
    tokens: int  # placeholder tokens it takes in the prompt

    @property
    def num_pixels(self) -> int:
        return self.height * self.width

    def array(self) -> np.ndarray:
        return np.frombuffer(self.pixels, dtype=np.uint8).reshape(self.height, self.width, 3)


def image_digest(height: int, width: int, pixels: bytes) -> bytes:
    head = b"dsi-image\x00" + height.to_bytes(4, "little") + width.to_bytes(4, "little")
    return xxhash.xxh3_128_digest(head + pixels)


def decode_image(url: str, cfg: VisionConfig, limits: ImageLimits, param: str) -> DecodedImage:
    """One image URL -> DecodedImage; RequestError 400 naming ``param`` when it cannot be used."""
    raw = _image_bytes(url, limits, param)
    try:
        with Image.open(io.BytesIO(raw)) as im:
            if im.format not in FORMATS:
                raise _bad(param, f"unsupported image format {im.format}; send PNG, JPEG, GIF or WEBP")
            w, h = im.size
            if w < 1 or h < 1:
                raise _bad(param, f"the image has no pixels ({w} x {h})")
            if w * h > limits.max_source_pixels:
                raise _bad(
                    param, f"the image is {w} x {h} pixels; at most {limits.max_source_pixels} are accepted"
                )
            im.seek(0)
            rgb = im.convert("RGB")
            rgb.load()
    except RequestError:
        raise
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError, EOFError) as exc:
        kind = (
            "unsupported or unrecognised image data" if isinstance(exc, UnidentifiedImageError) else str(exc)
        )
        raise _bad(param, f"the image cannot be decoded: {kind}") from None
    nh, nw = fit(h, w, cfg)
    if (nh, nw) != (h, w):
        rgb = rgb.resize((nw, nh), Image.Resampling.BICUBIC)
    pixels = rgb.tobytes()
    return DecodedImage(pixels, nh, nw, image_digest(nh, nw, pixels), cfg.tokens(nh, nw))


def fit(height: int, width: int, cfg: VisionConfig) -> tuple[int, int]:
    """The resized (height, width): aspect kept, each a multiple of ``cfg.unit`` (at least one),
    at most ``cfg.max_pixels`` in all."""
    u = cfg.unit
    scale = min(1.0, math.sqrt(cfg.max_pixels / (height * width)))
    nh = max(u, round(height * scale / u) * u)
    nw = max(u, round(width * scale / u) * u)
    while nh * nw > cfg.max_pixels:  # rounding up, or a thin image held at one unit
        if nh >= nw:
            nh -= u
        else:
            nw -= u
    return nh, nw


def _image_bytes(url: str, limits: ImageLimits, param: str) -> bytes:
    if url.startswith("data:"):
        m = _DATA_URL.match(url)
        if m is None:
            raise _bad(param, "an image data URL must be data:<media type>;base64,<data>")
        data = m.group("data")
        if len(data) > limits.max_bytes * 4 // 3 + 4:
            raise _bad(param, f"the image is larger than {limits.max_bytes} bytes")
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise _bad(param, "the image data is not valid base64") from None
    elif url.startswith(("http://", "https://")):
        if not limits.allow_fetch:
            raise _bad(
                param, "image URLs are not fetched by this server; send the image as a base64 data URL"
            )
        raw = _fetch(url, limits, param)
    else:
        raise _bad(param, "an image must be a base64 data URL (or an http(s) URL where fetching is on)")
    if not raw:
        raise _bad(param, "the image data is empty")
    if len(raw) > limits.max_bytes:
        raise _bad(param, f"the image is larger than {limits.max_bytes} bytes")
    return raw


def _fetch(url: str, limits: ImageLimits, param: str) -> bytes:
    try:
        return fetch_image(url, FetchLimits(limits.max_bytes, limits.fetch_timeout_s, limits.fetch_allow))
    except ImageFetchError as exc:
        raise _bad(param, str(exc)) from None


def _bad(param: str, message: str) -> RequestError:
    return RequestError(400, f"{param}: {message}", param=param, code="invalid_image")
