"""Byte layout of one Block KV page and one state slot, and the exact byte accounting.

A Block KV page holds everything the KV-owning layers keep for 128 consecutive tokens::

    page = [ source 0 latents: 64 x D ][ source 1 latents: 64 x D ] ... [ global: 128 x D ]
             ratio-2 compressed, one latent per token pair                 ratio-1, one per token

A state slot holds what is per sequence and never paged or persisted::

    rings   [n_layers, 2 (k, v), ring = window + rollback, n_kv_heads, D]   SWA rings, slot = pos % ring
    partial [n_sources, D]    compressor: wc0 @ x of an unpaired even token (odd length so far)

The engine stores both in fp32. The accounting functions below also price the production
formats of a config (fp8 latents with fp32 group scales, a bf16 rotary part, fp8 indexer keys,
bf16 rings), which is how ``flash`` is sized.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from dsi.model.config import ModelConfig

if TYPE_CHECKING:
    from dsi.model.llama import LlamaConfig


@dataclass(slots=True, frozen=True)
class BlockLayout:
    """Element offsets of each part inside one page (engine format, one dtype)."""

    cfg: ModelConfig

    @property
    def per_block_compressed(self) -> int:
        return self.cfg.block_size // self.cfg.compress_ratio

    @property
    def elems(self) -> int:
        d = self.cfg.head_dim
        return len(self.cfg.kv_sources) * self.per_block_compressed * d + self.cfg.block_size * d

    def source_offset(self, index: int) -> int:
        return index * self.per_block_compressed * self.cfg.head_dim

    @property
    def global_offset(self) -> int:
        return self.source_offset(len(self.cfg.kv_sources))

    def source_view(self, pages: torch.Tensor, index: int) -> torch.Tensor:
        """[num_blocks, elems] -> [num_blocks, block_size / ratio, D] view of one source."""
        n, start = self.per_block_compressed * self.cfg.head_dim, self.source_offset(index)
        return pages[:, start : start + n].unflatten(1, (self.per_block_compressed, self.cfg.head_dim))

    def global_view(self, pages: torch.Tensor) -> torch.Tensor:
        """[num_blocks, elems] -> [num_blocks, block_size, D] view of the ratio-1 global latents."""
        start = self.global_offset
        return pages[:, start:].unflatten(1, (self.cfg.block_size, self.cfg.head_dim))


def page_elems(cfg: ModelConfig | LlamaConfig) -> int:
    """fp32 values of one Block KV page of any family (the engine format)."""
    if cfg.family != "v4":
        from dsi.kvcache.layout_dense import DenseBlockLayout

        return DenseBlockLayout(cfg).elems
    return BlockLayout(cfg).elems


@dataclass(slots=True, frozen=True)
class ByteAccount:
    """Bytes per Block KV page and per state slot, itemised, in a config's storage formats."""

    latent_entry: float  # one latent: values + scales + rotary part
    index_entry: float  # one indexer key (0 when the config has no indexer)
    compressed_per_block: int  # latents of one source layer per page
    block: float
    ring_layer: float  # one layer's SWA ring (k and v)
    partial: float  # compressor partial state of all sources
    state_slot: float

    def table(self) -> list[tuple[str, str]]:
        return [
            ("latent entry", f"{self.latent_entry:g} B"),
            ("indexer key", f"{self.index_entry:g} B"),
            ("Block KV page (128 tokens)", f"{self.block:,.0f} B = {self.block / 1024:.1f} KiB"),
            ("SWA ring per layer", f"{self.ring_layer:,.0f} B"),
            ("compressor partial state", f"{self.partial:,.0f} B"),
            ("state slot", f"{self.state_slot:,.0f} B = {self.state_slot / 1024:.1f} KiB"),
        ]


def account(cfg: ModelConfig) -> ByteAccount:
    d = cfg.head_dim
    scales = 4 * math.ceil(d / cfg.latent_scale_group) if cfg.latent_scale_group else 0
    latent = d * cfg.latent_bytes + scales + 2 * cfg.latent_rope_dim
    index = (cfg.index_dim + 4) if cfg.index_dim else 0
    per_src = cfg.block_size // cfg.compress_ratio
    block = len(cfg.kv_sources) * per_src * latent + cfg.block_size * (latent + index)
    ring = 2 * cfg.ring * cfg.n_kv_heads * d * cfg.swa_bytes
    partial = len(cfg.kv_sources) * d * 4.0
    return ByteAccount(latent, index, per_src, block, ring, partial, cfg.n_layers * ring + partial)


def engine_block_bytes(cfg: ModelConfig, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of one page as this engine stores it (one dtype, no scales)."""
    return BlockLayout(cfg).elems * torch.empty((), dtype=dtype).element_size()


def engine_state_bytes(cfg: ModelConfig, dtype: torch.dtype = torch.float32) -> int:
    size = torch.empty((), dtype=dtype).element_size()
    rings = cfg.n_layers * 2 * cfg.ring * cfg.n_kv_heads * cfg.head_dim
    return (rings + len(cfg.kv_sources) * cfg.head_dim) * size
