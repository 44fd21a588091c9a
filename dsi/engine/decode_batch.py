"""Batched attention for decode slices (one new token per sequence).

Prefill chunks attend per sequence; the many one-token slices of a decode step are gathered
into padded tensors once per step and attend together::

    ring keys   [B, window - 1]  positions t-127 .. t-1 (masked below the slice's SWA start)
    + new key   [B, 1]           position t
    latents     [B, N]           entries 0 .. n_b - 1, padded to N = max n_b (masked)

Padding enters the joint softmax as -inf, so each row sees exactly the keys of the
per-sequence path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dsi.model.config import ModelConfig


@dataclass(slots=True)
class DecodeIndex:
    """Gather indices for one half (producer or consumer) of one step's decode slices."""

    rows: torch.Tensor  # [B] rows of these tokens in the half's activations
    slots: torch.Tensor  # [B] state slots
    pos: torch.Tensor  # [B] positions of the new tokens
    ring_idx: torch.Tensor  # [B, W-1] ring rows of the previous window - 1 positions
    ring_ok: torch.Tensor  # [B, W-1] bool: position valid for this half's SWA
    tables: torch.Tensor  # [B, max pages] block tables padded with the null page
    protect: torch.Tensor  # [B] page entries of positions below this hold loaded latents: never written
    swa_start: torch.Tensor  # [B] first position this half's SWA sees


def build_index(
    cfg: ModelConfig,
    rows: list[int],
    slots: list[int],
    pos: list[int],
    swa_start: list[int],
    tables: list[list[int]],
    protect: list[int] | None = None,
) -> DecodeIndex:
    p = torch.tensor(pos, dtype=torch.long)
    start = torch.tensor(swa_start, dtype=torch.long)
    prev = p[:, None] - (cfg.window - 1) + torch.arange(cfg.window - 1)[None, :]
    ok = prev >= start[:, None]
    width = max(len(t) for t in tables)
    padded = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long)
    return DecodeIndex(
        torch.tensor(rows, dtype=torch.long),
        torch.tensor(slots, dtype=torch.long),
        p,
        prev.clamp(min=0) % cfg.ring,
        ok,
        padded,
        torch.tensor(protect if protect is not None else [0] * len(pos), dtype=torch.long),
        start,
    )


def gather_latents(
    view: torch.Tensor, idx: DecodeIndex, count: torch.Tensor, per_block: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Latents 0..count_b-1 of each sequence: ([B, N, D], valid [B, N]) from a page view."""
    n = int(count.max()) if len(count) else 0
    entries = torch.arange(n)[None, :].expand(len(count), n)
    valid = entries < count[:, None]
    page = idx.tables.gather(1, (entries // per_block).clamp(max=idx.tables.shape[1] - 1))
    return view[page, entries % per_block], valid


def attend_decode(
    cfg: ModelConfig,
    q: torch.Tensor,
    q_rot: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    ring: torch.Tensor,
    idx: DecodeIndex,
    latents: torch.Tensor | None,
    lat_valid: torch.Tensor | None,
) -> torch.Tensor:
    """q, q_rot: [B, Hq, D]; k_new, v_new: [B, Hkv, D]; ring: [slots, 2, ring, Hkv, D] of this
    layer. Returns [B, Hq * D]."""
    b, hq, d = q.shape
    group = hq // k_new.shape[1]
    keys = torch.cat([ring[idx.slots[:, None], 0, idx.ring_idx], k_new[:, None]], dim=1)  # [B, W, Hkv, D]
    vals = torch.cat([ring[idx.slots[:, None], 1, idx.ring_idx], v_new[:, None]], dim=1)
    ok = torch.cat([idx.ring_ok, torch.ones(b, 1, dtype=torch.bool)], dim=1)  # [B, W]
    qg = q_rot.view(b, k_new.shape[1], group, d)
    scale = 1.0 / math.sqrt(d)
    s_swa = torch.einsum("bkgd,bwkd->bkgw", qg, keys).reshape(b, hq, -1) * scale
    s_swa = s_swa.masked_fill(~ok[:, None, :], float("-inf"))
    if latents is None or latents.shape[1] == 0:
        p = torch.softmax(s_swa, dim=-1)
        out = torch.einsum("bkgw,bwkd->bkgd", p.view(b, k_new.shape[1], group, -1), vals)
        return out.reshape(b, hq * d)
    s_lat = torch.einsum("bhd,bnd->bhn", q, latents) * scale
    s_lat = s_lat.masked_fill(~lat_valid[:, None, :], float("-inf"))
    p = torch.softmax(torch.cat([s_swa, s_lat], dim=-1), dim=-1)
    w = keys.shape[1]
    out = torch.einsum("bkgw,bwkd->bkgd", p[..., :w].reshape(b, k_new.shape[1], group, w), vals).reshape(
        b, hq, d
    )
    out = out + torch.einsum("bhn,bnd->bhd", p[..., w:], latents)
    return out.reshape(b, hq * d)
