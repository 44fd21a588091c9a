"""Block KV page of a full-attention family (Llama): K and V of every layer for 128 tokens.

    page = [ layer 0: K [128, Hkv, D] | V [128, Hkv, D] ][ layer 1: K | V ] ... [ layer L-1: K | V ]
           keys rotated (RoPE applied), values as projected; one entry per token position

Such a model has no sliding-window layers and no compressor, so its state slot is empty (rings
of length 0, no partial rows) and a whole request is its pages. SmolLM2-135M (30 layers, 3 KV
heads of 64): 1,474,560 fp32 values = 5.6 MiB per page in the engine format.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from dsi.model.llama import LlamaConfig


@dataclass(slots=True, frozen=True)
class DenseBlockLayout:
    """Element layout of one page (engine format, one dtype)."""

    cfg: LlamaConfig

    @property
    def elems(self) -> int:
        c = self.cfg
        return c.n_layers * 2 * c.block_size * c.n_kv_heads * c.head_dim

    def kv_view(self, pages: torch.Tensor) -> torch.Tensor:
        """[num_blocks, elems] -> [num_blocks, n_layers, 2 (k, v), block_size, n_kv_heads, D] view."""
        c = self.cfg
        return pages.view(pages.shape[0], c.n_layers, 2, c.block_size, c.n_kv_heads, c.head_dim)
