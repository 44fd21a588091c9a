"""SharedArena: named tensors in one /dev/shm file that every rank of an EP group maps.

Rank 0 creates the file, the other ranks attach to it by name; once every rank has mapped it,
rank 0 unlinks it (the mappings stay valid), so nothing is left under /dev/shm even when a rank
is killed later. What the group shares this way:

    weights arena   every weight but the routed experts (embeddings, attention, norms, router,
                    shared expert): the worker ranks' dense layers read them
    state arena     the engine's KV pages [num_blocks, elems], SWA rings and compressor partial
                    state (StateSlots): any rank computes attention for any sequence of a step,
                    rank 0 still allocates, exports and imports them

File layout: each tensor at an offset aligned to ``ALIGN`` bytes, in the order of its ``Layout``::

    | name 0 (nbytes, padded) | name 1 ... |
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import torch

from dsi.kvcache.shm import SHM_DIR, check_name

ALIGN = 64  # bytes
DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
}


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    shape: tuple[int, ...]
    dtype: str  # a key of DTYPES

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * DTYPES[self.dtype].itemsize


Layout = list[Entry]


def layout_of(tensors: dict[str, torch.Tensor]) -> Layout:
    names = {v: k for k, v in DTYPES.items()}
    return [Entry(k, tuple(t.shape), names[t.dtype]) for k, t in tensors.items()]


def _offsets(layout: Layout) -> tuple[list[int], int]:
    offsets, at = [], 0
    for e in layout:
        offsets.append(at)
        at += -(-e.nbytes // ALIGN) * ALIGN
    return offsets, max(at, ALIGN)


class SharedArena:
    """``tensors``: name -> view into the mapped file (shape and dtype of its Entry)."""

    def __init__(self, path: Path, layout: Layout, owner: bool) -> None:
        offsets, total = _offsets(layout)
        raw = torch.from_file(str(path), shared=True, size=total, dtype=torch.uint8)
        self.name, self.path, self.owner, self.layout = path.name, path, owner, layout
        self.tensors = {
            e.name: raw[o : o + e.nbytes].view(DTYPES[e.dtype]).view(e.shape)
            for e, o in zip(layout, offsets, strict=True)
        }

    @classmethod
    def create(cls, layout: Layout, prefix: str = "dsi-ep") -> SharedArena:
        """A new zero-filled file named ``<prefix>-<pid>-<hex>`` (see dsi.kvcache.shm.CREATED_NAME)."""
        path = SHM_DIR / f"{prefix}-{os.getpid()}-{secrets.token_hex(6)}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        try:
            return cls(path, layout, owner=True)
        except BaseException:
            path.unlink(missing_ok=True)
            raise

    @classmethod
    def attach(cls, name: str, layout: Layout) -> SharedArena:
        return cls(SHM_DIR / check_name(name), layout, owner=False)

    def unlink(self) -> None:
        """The creator removes the file once every rank has mapped it."""
        if self.owner:
            self.path.unlink(missing_ok=True)
