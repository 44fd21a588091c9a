"""Math shared by the naive reference and the paged engine: both must call exactly these."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from dsi.model.config import ModelConfig

Matmul = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [T, H] -> [T, H]."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding, half-split layout. x: [T, heads, D]; positions: [T] (int64)."""
    return rope_rotate(x, *rope_angles(positions, x.shape[-1], theta, x.dtype))


def rope_angles(
    positions: torch.Tensor, d: int, theta: float, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [T, 1, D/2] of positions [T] (int64) for head dim d, computed in float64."""
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = positions.to(torch.float64)[:, None] * inv[None, :]  # [T, D/2]
    return ang.cos().to(dtype)[:, None, :], ang.sin().to(dtype)[:, None, :]


def rope_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D] rotated by :func:`rope_angles` (the same bits as :func:`rope`)."""
    d = x.shape[-1]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def moe(
    x: torch.Tensor,
    w: dict[str, torch.Tensor],
    prefix: str,
    cfg: ModelConfig,
    mm: Matmul = torch.matmul,
    row_tile: int = 1,
) -> torch.Tensor:
    """Routed top-k experts (weights renormalised over the chosen k) + one shared expert.

    x: [T, H] (already normalised) -> [T, H]. Each token's result depends only on that token.
    Token-expert pairs are sorted by expert so each expert runs one matmul over its rows; a
    token's two or more expert outputs are added in expert order. ``mm``: the product to use
    (the engine's batch-invariant one, or plain ``@``). ``row_tile``: the rows ``mm`` computes
    a product in (:data:`dsi.engine.invariant.ROW_TILE`); an expert's rows are padded with zeros
    to a multiple of it once, so that its three products need no padding of their own (zero rows
    stay zeros through the SwiGLU, and a row's bits do not depend on the rows beside it).
    """
    top_w, top_i = route(x, w[prefix + "router"], cfg.top_k, mm)  # [T, k]
    shared = shared_expert(x, w, prefix, mm)
    w1, w3, w2 = w[prefix + "w1"], w[prefix + "w3"], w[prefix + "w2"]
    pairs = top_i.reshape(-1)  # pair t * k + j: token t's j-th expert
    order = pairs.argsort(stable=True)  # pair index, grouped by expert
    counts = torch.bincount(pairs, minlength=cfg.n_experts).tolist()
    xs = x[order // cfg.top_k]
    ys = torch.empty_like(xs)  # in pair order
    a = 0
    for e, n in enumerate(counts):
        if n:
            rows = xs[a : a + n]
            if n % row_tile:
                rows = F.pad(rows, (0, 0, 0, row_tile - n % row_tile))
            ys[order[a : a + n]] = expert_ffn(rows, w1[e], w3[e], w2[e], mm)[:n]
        a += n
    return combine(x, top_i, top_w, ys) + shared


def expert_ffn(
    x: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor, mm: Matmul = torch.matmul
) -> torch.Tensor:
    """One routed expert (SwiGLU): x [N, H], w1 / w3 [H, F], w2 [F, H] -> [N, H]. Row i of the
    result depends only on row i of x (with a row-invariant ``mm``), wherever the expert runs."""
    return mm(F.silu(mm(x, w1)) * mm(x, w3), w2)


def combine(x: torch.Tensor, top_i: torch.Tensor, top_w: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    """Weighted sum of each token's expert outputs, added in expert order (a fixed order, so the
    bits do not depend on where the experts ran). x: [T, H]; top_i, top_w: [T, k];
    ys: [T * k, H] output of pair ``t * k + j`` -> [T, H]."""
    k = top_i.shape[1]
    order = top_i.reshape(-1).argsort(stable=True)
    out = torch.zeros_like(x)
    out.index_add_(0, order // k, ys[order] * top_w.reshape(-1)[order, None])
    return out


def route(x: torch.Tensor, router: torch.Tensor, top_k: int, mm: Matmul) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing with the weights renormalised over the chosen k: x [T, H] -> ([T, k], [T, k])."""
    probs = torch.softmax(mm(x, router), dim=-1)  # [T, E]
    top_w, top_i = probs.topk(top_k, dim=-1)
    return top_w / top_w.sum(-1, keepdim=True), top_i


def shared_expert(x: torch.Tensor, w: dict[str, torch.Tensor], prefix: str, mm: Matmul) -> torch.Tensor:
    return mm(F.silu(mm(x, w[prefix + "s1"])) * mm(x, w[prefix + "s3"]), w[prefix + "s2"])


def attend(
    q: torch.Tensor,
    q_rot: torch.Tensor,
    q_pos: torch.Tensor,
    k_rot: torch.Tensor,
    v: torch.Tensor,
    k_pos: torch.Tensor,
    swa_start: int,
    latents: torch.Tensor | None,
    latent_last: torch.Tensor | None,
    window: int,
) -> torch.Tensor:
    """One sequence's attention: SWA branch + global latents, one joint softmax.

    q, q_rot: [Tq, Hq, D] (without / with rotary); q_pos: [Tq].
    k_rot, v: [Tk, Hkv, D]; k_pos: [Tk] positions of the SWA keys (any order, may include
    positions the mask drops). A query at t sees SWA keys with
    ``max(swa_start, t - window + 1) <= pos <= t``.
    latents: [Tg, D] keys = values of the global branch (no rotary); latent_last: [Tg], the last
    token position each latent covers; a query at t sees latents with ``last <= t``.
    Returns [Tq, Hq * D].
    """
    tq, hq, d = q.shape
    group = hq // k_rot.shape[1]
    scale = 1.0 / math.sqrt(d)
    k_full = k_rot.repeat_interleave(group, dim=1)  # [Tk, Hq, D]
    v_full = v.repeat_interleave(group, dim=1)
    s_swa = torch.einsum("qhd,khd->hqk", q_rot, k_full) * scale  # [Hq, Tq, Tk]
    qp, kp = q_pos[:, None], k_pos[None, :]
    ok = (kp <= qp) & (kp > qp - window) & (kp >= swa_start)  # [Tq, Tk]
    s_swa = s_swa.masked_fill(~ok[None], float("-inf"))
    if latents is None or latents.shape[0] == 0:
        p = torch.softmax(s_swa, dim=-1)
        out = torch.einsum("hqk,khd->qhd", p, v_full)
        return out.reshape(tq, hq * d)
    s_glob = torch.einsum("qhd,gd->hqg", q, latents) * scale  # [Hq, Tq, Tg]
    s_glob = s_glob.masked_fill(~(latent_last[None, :] <= qp)[None], float("-inf"))
    p = torch.softmax(torch.cat([s_swa, s_glob], dim=-1), dim=-1)
    tk = k_rot.shape[0]
    out = torch.einsum("hqk,khd->qhd", p[..., :tk], v_full) + torch.einsum(
        "hqg,gd->qhd", p[..., tk:], latents
    )
    return out.reshape(tq, hq * d)


def compress_pairs(
    x_even: torch.Tensor, x_odd: torch.Tensor, wc0: torch.Tensor, wc1: torch.Tensor, mm: Matmul = torch.matmul
) -> torch.Tensor:
    """Ratio-2 compressed latents of token pairs: [P, H] x2 -> [P, D]."""
    return mm(x_even, wc0) + mm(x_odd, wc1)
