"""Image embeddings inside the engine: prompt positions whose input embeddings come from the
vision encoder instead of the token embedding table.

    prompt     ... <start> <pad> <pad> ... <pad> <end> ...
    positions           [offset ............ offset + n)      ImageEmbeds.embeds [n, hidden] fp32

A step computes positions [start, end) of a request (a prefill chunk, a replay after a hit, a
recompute after a preemption): ``slice_embeds`` gives the rows of that slice that an image
covers, so any chunking places every image row where it belongs. The request keeps its images
until it finishes or is exported (a preemption recomputes with them; an export carries them in
the RequestState's ``images`` buffer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dsi.errors import InvalidRequest
from dsi.kvcache.hashchain import image_extras


@dataclass(slots=True, frozen=True)
class ImageEmbeds:
    """Positions [offset, offset + embeds.shape[0]) of a prompt take ``embeds`` [n, hidden] fp32
    as input embeddings; ``digest`` (16 bytes) is the image's content hash (a block-hash extra)."""

    offset: int
    embeds: torch.Tensor
    digest: bytes = b""

    @property
    def tokens(self) -> int:
        return self.embeds.shape[0]

    @property
    def end(self) -> int:
        return self.offset + self.tokens


def check_images(hidden: int, prompt_len: int, images: Sequence[ImageEmbeds]) -> None:
    """Images inside the prompt, in order, not overlapping, each fp32 [n >= 1, hidden]."""
    prev = 0
    for im in images:
        e = im.embeds
        if (
            not isinstance(e, torch.Tensor)
            or e.dtype != torch.float32
            or e.dim() != 2
            or e.shape[1] != hidden
        ):
            raise InvalidRequest(f"image embeddings must be float32 [n, {hidden}]")
        if e.shape[0] < 1 or im.offset < prev or im.end > prompt_len:
            raise InvalidRequest("images must lie inside the prompt, in order, without overlapping")
        prev = im.end


def slice_embeds(images: Sequence[ImageEmbeds], start: int, end: int) -> list[tuple[int, torch.Tensor]]:
    """(row within the slice [start, end), rows of embeddings) for each image overlapping it."""
    out = []
    for im in images:
        lo, hi = max(start, im.offset), min(end, im.end)
        if lo < hi:
            out.append((lo - start, im.embeds[lo - im.offset : hi - im.offset]))
    return out


def block_extras(images: Sequence[ImageEmbeds], block_size: int) -> dict[int, bytes]:
    """The hash-chain extra keys of a request's blocks (see ``image_extras``)."""
    return image_extras([(im.offset, im.tokens, im.digest) for im in images], block_size)


def packed(images: Sequence[ImageEmbeds], hidden: int) -> torch.Tensor:
    """Every image's rows in order: [sum of n, hidden] fp32 (a RequestState's ``images`` buffer)."""
    if not images:
        return torch.empty(0, hidden)
    return torch.cat([im.embeds for im in images])


def unpacked(buffer: torch.Tensor, spans: Sequence[tuple[int, int, bytes]]) -> tuple[ImageEmbeds, ...]:
    """``packed`` undone: ``spans`` are (offset, tokens, digest) in order; copies the rows."""
    out, row = [], 0
    for offset, n, digest in spans:
        out.append(ImageEmbeds(offset, buffer[row : row + n].clone(), digest))
        row += n
    if row != buffer.shape[0]:
        raise InvalidRequest(f"image spans cover {row} rows; the images buffer has {buffer.shape[0]}")
    return tuple(out)


unpacked_images = unpacked  # the name roles import from dsi.engine
