"""The V4 prompt of a model with a vision encoder (the served model has a ``VisionSpec``; the
tiny model has one). Each image of a system, user or tool-result message is decoded
(dsi.recipe.images) and takes its place in the prompt as

    <｜rl_image_start｜> <｜rl_image_pad｜> x N <｜image｜>        ids 129263, 129262 x N, 129279

N = (H / 28) * (W / 28) for the image resized to H x W (multiples of 28, at most the encoder's
``max_pixels``): one pad per 2 x 2 group of 14 px patches, row-major. The engine replaces the
input embeddings of the N pads with the vision encoder's output. Images in assistant history
stay "[Unsupported Image]" text. Everything else is the text-only V4 prompt: an image sits where
V4 writes its placeholder text, joined by the same blank lines.

The layout is rendered without touching the V4 renderer: each image is first replaced by a
sentinel text that no request can contain (private-use characters around a fresh random
nonce), the conversation is rendered, and every sentinel is then cut out of its text segment
and replaced by the image's tokens.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from dsi.model.vision_config import VisionConfig
from dsi.recipe.conversation import Conversation, ImageRef, ModelVersion
from dsi.recipe.images import DecodedImage, ImageLimits, decode_image
from dsi.recipe.render import Rendered, render
from dsi.recipe.segments import Control, RenderedPrompt, Segment
from dsi.recipe.wire import fail

IMAGE_START_ID = 129263  # <｜rl_image_start｜>
IMAGE_PAD_ID = 129262  # <｜rl_image_pad｜>
IMAGE_END_ID = 129279  # <｜image｜> (Control.IMAGE)


@dataclass(slots=True, frozen=True)
class VisionSpec:
    """A served model's vision encoder as the recipe needs it: its shape (sizes, resizing) and
    the bounds on input images."""

    config: VisionConfig
    limits: ImageLimits = field(default_factory=ImageLimits)


@dataclass(slots=True, frozen=True)
class PlacedImage:
    """An image in a prompt: its pad tokens are positions [offset, offset + image.tokens)."""

    image: DecodedImage
    offset: int

    @property
    def end(self) -> int:
        return self.offset + self.image.tokens


@dataclass(slots=True, frozen=True)
class VisionPrompt:
    rendered: Rendered  # its text shows one <｜image｜> per image
    token_ids: tuple[int, ...]  # every image expanded to start, pads, end
    images: tuple[PlacedImage, ...]  # in prompt order


def render_vision(
    conv: Conversation, spec: VisionSpec, encode: Callable[[RenderedPrompt], tuple[int, ...]]
) -> VisionPrompt:
    """``conv`` in the V4 format with its images decoded and placed. ``encode``: the served
    model's prompt encoder. Raises RequestError 400 for an image that cannot be used. A
    conversation without images renders and encodes as a text-only model's would."""
    refs = conv.images()
    if not refs:
        plain = render(conv, ModelVersion.V4)
        return VisionPrompt(plain, tuple(encode(plain.prompt)), ())
    if len(refs) > spec.limits.max_images:
        raise fail(f"at most {spec.limits.max_images} images are accepted per request, not {len(refs)}")
    decoded = [_decode(ref, i, spec) for i, ref in enumerate(refs)]
    nonce = secrets.token_hex(8)
    rendered = render(_marked(conv, nonce), ModelVersion.V4)
    segments, order = _cut(rendered.prompt.segments, nonce)
    if sorted(order) != list(range(len(refs))):
        raise fail("an image is in a place of the conversation that the prompt format cannot show")
    prompt = RenderedPrompt.from_segments(segments)
    ids: list[int] = []
    placed: list[PlacedImage] = []
    for tok in encode(prompt):
        if tok != IMAGE_END_ID:
            ids.append(tok)
            continue
        image = decoded[order[len(placed)]]
        ids.append(IMAGE_START_ID)
        placed.append(PlacedImage(image, len(ids)))
        ids += [IMAGE_PAD_ID] * image.tokens + [IMAGE_END_ID]
    return VisionPrompt(Rendered(prompt, rendered.ends_in_thinking), tuple(ids), tuple(placed))


def _decode(ref: ImageRef, i: int, spec: VisionSpec) -> DecodedImage:
    if ref.source_error is not None:
        raise fail(ref.source_error)
    return decode_image(ref.url, spec.config, spec.limits, f"image[{i}]")


def _sentinel(nonce: str, i: int) -> str:
    return f"\ue000{nonce}:{i}\ue000"


def _marked(conv: Conversation, nonce: str) -> Conversation:
    """Every ImageRef of a message's parts -> a numbered sentinel, in the order of ``conv.images()``."""
    n = 0
    messages = []
    for msg in conv.messages:
        parts = getattr(msg, "parts", None)
        if parts and any(isinstance(p, ImageRef) for p in parts):
            new: list[str | ImageRef] = []
            for p in parts:
                if isinstance(p, ImageRef):
                    p = _sentinel(nonce, n)
                    n += 1
                new.append(p)
            msg = replace(msg, parts=tuple(new))  # type: ignore[call-arg]
        messages.append(msg)
    return replace(conv, messages=tuple(messages))


def _cut(segments: tuple[Segment, ...], nonce: str) -> tuple[list[Segment], list[int]]:
    """Text segments split at the sentinels, each replaced by Control.IMAGE; the image numbers
    in prompt order."""
    pattern = re.compile("\ue000" + nonce + r":(\d+)\ue000")
    out: list[Segment] = []
    order: list[int] = []
    for seg in segments:
        if not isinstance(seg, str):
            out.append(seg)
            continue
        pos = 0
        for m in pattern.finditer(seg):
            out += [seg[pos : m.start()], Control.IMAGE]
            order.append(int(m.group(1)))
            pos = m.end()
        out.append(seg[pos:])
    return out, order
