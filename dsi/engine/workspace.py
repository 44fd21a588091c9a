"""Buffers a runner reuses from step to step for its activations, by name.

A product's output of a 3,000-row prefill is tens of MiB. Allocated fresh, it comes from new
pages: glibc maps allocations over 32 MiB (and, until its thresholds adapt, smaller ones) straight
from the kernel and unmaps them when freed, so every layer pays a page fault and a page clear per
4 KiB written (15-18 % of a served SmolLM2 prefill step, measured with perf). A
:class:`Workspace` keeps one buffer per name, grown to the largest step seen (at most
``max_bytes`` each; a larger request gets a fresh tensor, not kept)::

    ws.rows("gate_up", 3000, 3072)  -> fp32 [3000, 3072] view of the "gate_up" buffer

A view is valid until the next call for the same name: callers give each live activation its
own name.
"""

from __future__ import annotations

import torch

MAX_BYTES = 512 << 20  # the largest buffer kept per name


class Workspace:
    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._buffers: dict[str, torch.Tensor] = {}

    def rows(self, name: str, rows: int, width: int) -> torch.Tensor:
        """fp32 [rows, width], contiguous: the start of buffer ``name`` (grown when too small)."""
        need = rows * width
        buf = self._buffers.get(name)
        if buf is None or buf.numel() < need:
            if need * 4 > self.max_bytes:
                return torch.empty(rows, width)
            buf = self._buffers[name] = torch.empty(need)
        return buf[:need].view(rows, width)

    def nbytes(self) -> int:
        """Bytes held by the buffers kept."""
        return sum(b.numel() * b.element_size() for b in self._buffers.values())
