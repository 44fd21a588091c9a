"""A small vision transformer: images -> embeddings in the language model's hidden space.

    image [3, H, W] (H, W multiples of patch * merge = 28)
      --patches 14 x 14--> [gh * gw, 3 * 14 * 14] --patch_embed--> [gh * gw, D] + 2-D sin-cos positions
      --layers (pre-norm, full attention within the image, MLP)--> [gh * gw, D]
      --2 x 2 merge (4 neighbours concatenated)--> [gh/2 * gw/2, 4 D]
      --projector (MLP)--> [gh/2 * gw/2, lm_hidden]       one embedding per image placeholder token

Weights (D = hidden, F = mlp_dim, P = 3 * patch^2, L = lm_hidden)::

    patch_embed [P, D]           layers.{i}.norm1, .norm2 [D]
    layers.{i}.wqkv [D, 3 D]     layers.{i}.wo [D, D]     layers.{i}.w1 [D, F]   layers.{i}.w2 [F, D]
    merge_norm [4 D]             proj1 [4 D, L]           proj2 [L, L]

``encode_images`` runs a batch: every product over the rows of all images at once through the
engine's batch-invariant product, attention per image, so an image's embeddings are the same bits
whatever else is in its batch. The weights are seeded (``VisionConfig.seed``); they are random, as
the language model's are.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from dsi.engine import invariant
from dsi.model.ops import rms_norm
from dsi.model.vision_config import TINY_VISION, VISION_CONFIG, VISION_WEIGHTS, VisionConfig, vision_config_of

__all__ = [
    "TINY_VISION",
    "VISION_CONFIG",
    "VisionConfig",
    "encode_images",
    "image_tensor",
    "init_vision_weights",
    "load_vision",
    "save_vision",
    "vision_config_of",
]


def init_vision_weights(cfg: VisionConfig) -> dict[str, torch.Tensor]:
    """Seeded init (``cfg.seed``, its own generator: the language model's weights do not move)."""
    gen = torch.Generator().manual_seed(cfg.seed)
    d, f, p4 = cfg.hidden, cfg.mlp_dim, 4 * cfg.hidden

    def dense(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, generator=gen) / math.sqrt(rows)

    def norm(n: int) -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(n, generator=gen)

    w = {"patch_embed": dense(3 * cfg.patch * cfg.patch, d)}
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        w |= {
            p + "norm1": norm(d),
            p + "wqkv": dense(d, 3 * d),
            p + "wo": dense(d, d) * 0.5,
            p + "norm2": norm(d),
            p + "w1": dense(d, f),
            p + "w2": dense(f, d) * 0.5,
        }
    # The projector's output is scaled to the size of the language model's token embeddings.
    w |= {
        "merge_norm": norm(p4),
        "proj1": dense(p4, cfg.lm_hidden),
        "proj2": dense(cfg.lm_hidden, cfg.lm_hidden) * 0.05,
    }
    return w


def save_vision(directory: Path, cfg: VisionConfig, weights: dict[str, torch.Tensor]) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / VISION_CONFIG).write_text(cfg.to_json() + "\n")
    save_file({k: v.contiguous() for k, v in weights.items()}, str(directory / VISION_WEIGHTS))


def load_vision(directory: Path) -> tuple[VisionConfig, dict[str, torch.Tensor]]:
    """The vision encoder saved beside a model (``vision.json`` + ``vision.safetensors``)."""
    directory = Path(directory)
    if not (directory / VISION_CONFIG).exists():
        raise ValueError(f"{directory} holds no vision encoder ({VISION_CONFIG}); regenerate the model")
    cfg = VisionConfig.from_json((directory / VISION_CONFIG).read_text())
    weights = load_file(str(directory / VISION_WEIGHTS))
    expected = init_vision_weights(cfg)
    for name, t in expected.items():
        if name not in weights or weights[name].shape != t.shape:
            raise ValueError(f"{directory}: vision weight {name} missing or of the wrong shape")
    return cfg, weights


def patchify(cfg: VisionConfig, image: torch.Tensor) -> torch.Tensor:
    """[3, H, W] float -> [gh * gw, 3 * patch^2] in merge order: the 4 patches of a merged token
    are consecutive rows (row-major over merged tokens, then over the 2 x 2 patches)."""
    c, h, w = image.shape
    p, m = cfg.patch, cfg.merge
    gh, gw = h // p, w // p
    x = image.reshape(c, gh // m, m, p, gw // m, m, p)
    # -> [gh/m, gw/m, m, m, c, p, p]
    x = x.permute(1, 4, 2, 5, 0, 3, 6)
    return x.reshape(gh * gw, c * p * p)


def _positions(cfg: VisionConfig, gh: int, gw: int) -> torch.Tensor:
    """2-D sin-cos position embedding [gh * gw, hidden], rows in patchify's order."""
    m, d = cfg.merge, cfg.hidden // 2
    ys = torch.arange(gh).reshape(gh // m, m, 1, 1).expand(gh // m, m, gw // m, m)
    xs = torch.arange(gw).reshape(1, 1, gw // m, m).expand(gh // m, m, gw // m, m)
    ys = ys.permute(0, 2, 1, 3).reshape(-1).to(torch.float64)
    xs = xs.permute(0, 2, 1, 3).reshape(-1).to(torch.float64)
    inv = 1.0 / (10_000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    parts = []
    for v in (ys, xs):
        ang = v[:, None] * inv[None, :]
        parts += [ang.sin(), ang.cos()]
    return torch.cat(parts, dim=1).to(torch.float32)


@torch.no_grad()
def encode_images(
    cfg: VisionConfig, w: dict[str, torch.Tensor], images: list[torch.Tensor]
) -> list[torch.Tensor]:
    """Images [3, H, W] (float in [0, 1], H and W multiples of ``cfg.unit``) -> per image
    [tokens, lm_hidden] fp32 embeddings, in the images' order."""
    if not images:
        return []
    grids = [(im.shape[1] // cfg.patch, im.shape[2] // cfg.patch) for im in images]
    for im in images:
        if im.shape[0] != 3 or im.shape[1] % cfg.unit or im.shape[2] % cfg.unit or im.shape[1] == 0:
            raise ValueError(
                f"an image is [3, H, W] with H and W multiples of {cfg.unit}, not {tuple(im.shape)}"
            )
    x = torch.cat([patchify(cfg, (im - 0.5) / 0.5) for im in images])
    x = invariant.mm(x, w["patch_embed"]) + torch.cat([_positions(cfg, gh, gw) for gh, gw in grids])
    spans = _spans([gh * gw for gh, gw in grids])
    for i in range(cfg.n_layers):
        x = _layer(cfg, w, f"layers.{i}.", x, spans)
    merged = x.reshape(-1, cfg.merge * cfg.merge * cfg.hidden)  # patchify put a token's patches together
    h = invariant.mm(rms_norm(merged, w["merge_norm"], cfg.norm_eps), w["proj1"])
    out = invariant.mm(torch.relu(h), w["proj2"])
    per = cfg.merge * cfg.merge
    return [out[a // per : b // per].clone() for a, b in spans]


def _layer(
    cfg: VisionConfig, w: dict[str, torch.Tensor], p: str, x: torch.Tensor, spans: list[tuple[int, int]]
) -> torch.Tensor:
    d, heads = cfg.hidden, cfg.n_heads
    qkv = invariant.mm(rms_norm(x, w[p + "norm1"], cfg.norm_eps), w[p + "wqkv"])
    att = torch.empty_like(x)
    for a, b in spans:  # full attention within each image
        q, k, v = qkv[a:b].view(b - a, 3, heads, d // heads).permute(1, 2, 0, 3)
        scores = (q @ k.transpose(1, 2)) / math.sqrt(d // heads)
        att[a:b] = (torch.softmax(scores, dim=-1) @ v).permute(1, 0, 2).reshape(b - a, d)
    x = x + invariant.mm(att, w[p + "wo"])
    h = invariant.mm(rms_norm(x, w[p + "norm2"], cfg.norm_eps), w[p + "w1"])
    return x + invariant.mm(torch.relu(h), w[p + "w2"])


def _spans(lengths: list[int]) -> list[tuple[int, int]]:
    out, pos = [], 0
    for n in lengths:
        out.append((pos, pos + n))
        pos += n
    return out


def image_tensor(pixels: np.ndarray) -> torch.Tensor:
    """[H, W, 3] uint8 RGB -> [3, H, W] float32 in [0, 1] (what ``encode_images`` takes)."""
    return torch.from_numpy(np.array(pixels, dtype=np.uint8)).permute(2, 0, 1).to(torch.float32) / 255.0
