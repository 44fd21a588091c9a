"""Caller buffers as flat byte views, and their split into chunks of bounded size."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Buffer = Any  # bytes-like, memoryview, numpy array, or a contiguous CPU torch tensor


def byte_view(part: Buffer) -> memoryview:
    """A 1-D ``uint8`` view of one part, without copying; ValueError if it is not contiguous."""
    if hasattr(part, "untyped_storage"):  # a torch tensor: no buffer protocol of its own
        part = _torch_bytes(part)
    view = memoryview(part)
    if not view.c_contiguous:
        raise ValueError("KV transfer parts must be C-contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def _torch_bytes(tensor: Any) -> Any:
    import torch  # only when a caller passes a tensor

    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        raise ValueError("KV transfer parts must be contiguous CPU tensors")
    return tensor.detach().reshape(-1).view(torch.uint8).numpy()


def byte_views(parts: Sequence[Buffer], nbytes: int) -> list[memoryview]:
    """Every part as a byte view; ValueError unless their sizes add up to ``nbytes``."""
    views = [byte_view(p) for p in parts]
    total = sum(v.nbytes for v in views)
    if total != nbytes:
        raise ValueError(f"parts hold {total} bytes, the target expects {nbytes}")
    return [v for v in views if v.nbytes]


def chunks(views: list[memoryview], chunk_bytes: int) -> list[tuple[int, list[memoryview]]]:
    """Split the concatenation of ``views`` into chunks of at most ``chunk_bytes``.

    Returns ``[(offset, slices)]`` in order, ``offset`` in bytes from the start of the transfer;
    a part larger than a chunk is sliced (no copy). At least one (possibly empty) chunk.

    Example: parts of 3, 5 and 2 bytes with ``chunk_bytes=4`` ->
    ``[(0, [p0[0:3], p1[0:1]]), (4, [p1[1:5]]), (8, [p2[0:2]])]``.
    """
    out: list[tuple[int, list[memoryview]]] = []
    current: list[memoryview] = []
    start = offset = room = 0
    room = chunk_bytes
    for view in views:
        at = 0
        while at < view.nbytes:
            take = min(room, view.nbytes - at)
            current.append(view[at : at + take])
            at, offset, room = at + take, offset + take, room - take
            if room == 0:
                out.append((start, current))
                current, start, room = [], offset, chunk_bytes
    if current or not out:
        out.append((start, current))
    return out
