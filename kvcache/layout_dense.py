"""Block KV page of a dense family (Llama, Gemma 3): K and V of its full-attention layers for
128 tokens.

    page = [ full layer 0: K [128, Hkv, D] | V [128, Hkv, D] ][ full layer 1: K | V ] ... [ last: K | V ]
           keys rotated (RoPE applied), values as projected; one entry per token position

``cfg.full_layers`` lists those layers. Llama: every layer; no sliding-window layers and no
compressor, so its state slot is empty and a whole request is its pages. SmolLM2-135M (30
layers, 3 KV heads of 64): 1,474,560 fp32 values = 5.6 MiB per page in the engine format.
Gemma 3: the global layers only (its sliding layers keep SWA rings in the state slot); Gemma 3
270M (3 global layers, 1 KV head of 256): 196,608 fp32 values = 768 KiB per page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from dsi.model.gemma3 import Gemma3Config
    from dsi.model.llama import LlamaConfig


@dataclass(slots=True, frozen=True)
class DenseBlockLayout:
    """Element layout of one page (engine format, one dtype)."""

    cfg: LlamaConfig | Gemma3Config

    @property
    def elems(self) -> int:
        c = self.cfg
        return len(c.full_layers) * 2 * c.block_size * c.n_kv_heads * c.head_dim

    def kv_view(self, pages: torch.Tensor) -> torch.Tensor:
        """[num_blocks, elems] -> [num_blocks, n_full_layers, 2 (k, v), block_size, n_kv_heads, D] view."""
        c = self.cfg
        return pages.view(pages.shape[0], len(c.full_layers), 2, c.block_size, c.n_kv_heads, c.head_dim)
