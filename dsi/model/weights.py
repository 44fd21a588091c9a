"""Weights of the reference model: deterministic seeded init, safetensors save / load.

Names and shapes (H = hidden, D = head_dim, Q = n_heads * D, K = n_kv_heads * D,
E = n_experts, F = expert_dim, S = shared_dim, V = vocab)::

    embed                      [V, H]     (tied: also the output projection)
    final_norm                 [H]
    boundary.norm, boundary.wg [H], [H, D]   ratio-1 global latent at the YOCO boundary
    layers.{i}.attn_norm       [H]
    layers.{i}.wq              [H, Q]
    layers.{i}.wk, .wv         [H, K]
    layers.{i}.wo              [Q, H]
    layers.{i}.wc0, .wc1       [H, D]     KV-source layers only: compressor for token pairs
    layers.{i}.ffn_norm        [H]
    layers.{i}.router          [H, E]
    layers.{i}.w1, .w3         [E, H, F]
    layers.{i}.w2              [E, F, H]
    layers.{i}.s1, .s3, .s2    [H, S], [H, S], [S, H]   shared expert
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from dsi.model.config import ModelConfig


def init_weights(cfg: ModelConfig, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Seeded init (``cfg.seed``): the same config always gives the same weights."""
    gen = torch.Generator().manual_seed(cfg.seed)
    h, d = cfg.hidden, cfg.head_dim
    q, k = cfg.n_heads * d, cfg.n_kv_heads * d

    def dense(*shape: int) -> torch.Tensor:
        fan_in = shape[-2] if len(shape) >= 2 else shape[-1]
        return (torch.randn(*shape, generator=gen) / math.sqrt(fan_in)).to(dtype)

    def norm() -> torch.Tensor:
        return (1.0 + 0.1 * torch.randn(h, generator=gen)).to(dtype)

    w = {
        "embed": (torch.randn(cfg.vocab_size, h, generator=gen) * 0.05).to(dtype),
        "final_norm": norm(),
        "boundary.norm": norm(),
        "boundary.wg": dense(h, d),
    }
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        w |= {
            p + "attn_norm": norm(),
            p + "wq": dense(h, q),
            p + "wk": dense(h, k),
            p + "wv": dense(h, k),
            p + "wo": dense(q, h) * 0.5,
            p + "ffn_norm": norm(),
            p + "router": dense(h, cfg.n_experts),
            p + "w1": dense(cfg.n_experts, h, cfg.expert_dim),
            p + "w3": dense(cfg.n_experts, h, cfg.expert_dim),
            p + "w2": dense(cfg.n_experts, cfg.expert_dim, h) * 0.5,
            p + "s1": dense(h, cfg.shared_dim),
            p + "s3": dense(h, cfg.shared_dim),
            p + "s2": dense(cfg.shared_dim, h) * 0.5,
        }
        if i in cfg.kv_sources:
            w |= {p + "wc0": dense(h, d), p + "wc1": dense(h, d)}
    return w


def save_model(directory: Path, cfg: ModelConfig, weights: dict[str, torch.Tensor]) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cfg.save(directory)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(directory / "model.safetensors"))


def load_model(directory: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    directory = Path(directory)
    cfg = ModelConfig.load(directory)
    weights = load_file(str(directory / "model.safetensors"))
    expected = init_weights_shapes(cfg)
    missing = sorted(set(expected) - set(weights))
    if missing:
        raise ValueError(f"{directory}: weights missing: {', '.join(missing[:5])}")
    for name, shape in expected.items():
        if tuple(weights[name].shape) != shape:
            raise ValueError(f"{directory}: {name} has shape {tuple(weights[name].shape)}, expected {shape}")
    return cfg, weights


def init_weights_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Expected tensor shapes, without allocating (``flash`` is far too large to build)."""
    h, d = cfg.hidden, cfg.head_dim
    q, k, e, f, s = cfg.n_heads * d, cfg.n_kv_heads * d, cfg.n_experts, cfg.expert_dim, cfg.shared_dim
    shapes = {"embed": (cfg.vocab_size, h), "final_norm": (h,), "boundary.norm": (h,), "boundary.wg": (h, d)}
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        shapes |= {
            p + "attn_norm": (h,),
            p + "wq": (h, q),
            p + "wk": (h, k),
            p + "wv": (h, k),
            p + "wo": (q, h),
            p + "ffn_norm": (h,),
            p + "router": (h, e),
            p + "w1": (e, h, f),
            p + "w3": (e, h, f),
            p + "w2": (e, f, h),
            p + "s1": (h, s),
            p + "s3": (h, s),
            p + "s2": (s, h),
        }
        if i in cfg.kv_sources:
            shapes |= {p + "wc0": (h, d), p + "wc1": (h, d)}
    return shapes


def param_count(cfg: ModelConfig) -> int:
    return sum(math.prod(s) for s in init_weights_shapes(cfg).values())
