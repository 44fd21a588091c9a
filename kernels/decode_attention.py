"""Paged decode attention of the V4 shape: one new token per sequence over its SWA ring and the
global latents in its Block KV pages, one joint softmax (what ``dsi.model.ops.attend`` defines
for a one-token query)::

    row b (sequence in state slot slots[b], new token at pos[b]):
      SWA branch    keys/values ring[slots[b], 0/1, p % R]  for p in max(swa_start[b], pos[b] - window + 1) .. pos[b]
                    scored with q_rot (rotated), GQA: Hq / Hkv query heads per ring head
      global branch latents[tables[b, n // per_block], n % per_block]  for n in 0 .. count[b] - 1
                    keys = values, scored with q (not rotated), shared by every head

    q, q_rot [B, Hq, D]    ring [slots, 2, R, Hkv, D] (this layer; the new key/value already written)
    latents  [num_blocks, per_block, D] (a page view; may be strided)    tables [B, W] int64
    -> out [B, Hq * D] fp32

The ring holds R = window + rollback >= window positions, so position pos[b] is written before
the call without overwriting one of the window. :func:`paged_decode_attention` is the Triton
kernel (one program per row and ring head, keys in blocks of ``BLOCK_N`` folded into an online
softmax in ascending order: a row's result depends on that row alone, whatever the batch);
:func:`paged_decode_attention_reference` is the torch definition.
"""

from __future__ import annotations

import math

import torch

from dsi.kernels.triton_lang import jit, next_pow2, require, tl

BLOCK_N = 32  # keys per block of the online softmax


@jit
def _decode_attention_kernel(
    q_ptr, qr_ptr, out_ptr,
    ring_ptr, s_slot, s_kv, s_ring, s_head,
    slots_ptr, pos_ptr, start_ptr,
    lat_ptr, s_page, s_entry, tables_ptr, s_table, count_ptr,
    ring_len, window, per_block, scale,
    HQ: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, HAS_LAT: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    h = tl.program_id(1)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    gm, dm = g < G, d < D
    q_off = (b * HQ + h * G + g)[:, None] * D + d[None, :]
    qmask = gm[:, None] & dm[None, :]
    qr = tl.load(qr_ptr + q_off, mask=qmask, other=0.0).to(tl.float32)
    slot = tl.load(slots_ptr + b)
    pos = tl.load(pos_ptr + b)
    lo = tl.maximum(tl.load(start_ptr + b), pos - window + 1)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for k0 in range(lo, pos + 1, BLOCK_N):
        kpos = k0 + n
        km = kpos <= pos
        at = ring_ptr + slot * s_slot + h * s_head + (kpos % ring_len)[:, None] * s_ring + d[None, :]
        kvm = km[:, None] & dm[None, :]
        k = tl.load(at, mask=kvm, other=0.0).to(tl.float32)
        v = tl.load(at + s_kv, mask=kvm, other=0.0).to(tl.float32)
        s = tl.sum(qr[:, None, :] * k[None, :, :], axis=2) * scale
        s = tl.where(km[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m_i = m_new
    if HAS_LAT:
        q = tl.load(q_ptr + q_off, mask=qmask, other=0.0).to(tl.float32)
        count = tl.load(count_ptr + b)
        for e0 in range(0, count, BLOCK_N):
            e = e0 + n
            em = e < count
            page = tl.load(tables_ptr + b * s_table + e // per_block, mask=em, other=0)
            lat = tl.load(
                lat_ptr + page[:, None] * s_page + (e % per_block)[:, None] * s_entry + d[None, :],
                mask=em[:, None] & dm[None, :],
                other=0.0,
            ).to(tl.float32)
            s = tl.sum(q[:, None, :] * lat[None, :, :], axis=2) * scale
            s = tl.where(em[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * lat[None, :, :], axis=1)
            m_i = m_new
    tl.store(out_ptr + q_off, acc / l_i[:, None], mask=qmask)


def _check(q, q_rot, ring, slots, pos, swa_start, latents, tables, count) -> None:
    b, hq, d = q.shape
    if q_rot.shape != q.shape or ring.dim() != 5 or ring.shape[1] != 2 or ring.shape[4] != d:
        raise ValueError("q, q_rot must be [B, Hq, D] and ring [slots, 2, R, Hkv, D] of the same D")
    if hq % ring.shape[3] or ring.stride(4) != 1:
        raise ValueError("Hq must be a multiple of the ring's Hkv, and the ring's D contiguous")
    for name, t in (("slots", slots), ("pos", pos), ("swa_start", swa_start)):
        if t.shape != (b,) or t.dtype != torch.long:
            raise ValueError(f"{name} must be int64 [B]")
    if latents is not None:
        if latents.dim() != 3 or latents.shape[2] != d or latents.stride(2) != 1:
            raise ValueError("latents must be a [num_blocks, per_block, D] page view with D contiguous")
        if tables is None or count is None or tables.dim() != 2 or tables.shape[0] != b:
            raise ValueError("latents need tables [B, W] and count [B]")
        if tables.dtype != torch.long or count.dtype != torch.long or count.shape != (b,):
            raise ValueError("tables and count must be int64")


def paged_decode_attention(
    q: torch.Tensor,
    q_rot: torch.Tensor,
    ring: torch.Tensor,
    slots: torch.Tensor,
    pos: torch.Tensor,
    swa_start: torch.Tensor,
    window: int,
    latents: torch.Tensor | None = None,
    tables: torch.Tensor | None = None,
    count: torch.Tensor | None = None,
) -> torch.Tensor:
    """The Triton kernel (see the module docstring for the shapes). -> [B, Hq * D] fp32."""
    _check(q, q_rot, ring, slots, pos, swa_start, latents, tables, count)
    require(q, "paged_decode_attention")
    b, hq, d = q.shape
    hkv = ring.shape[3]
    q, q_rot = q.contiguous(), q_rot.contiguous()
    out = torch.empty(b, hq, d, dtype=torch.float32, device=q.device)
    if b == 0:
        return out.view(0, hq * d)
    has_lat = latents is not None
    lat = latents if has_lat else ring
    tab = tables.contiguous() if has_lat else slots
    cnt = count if has_lat else slots
    _decode_attention_kernel[(b, hkv)](
        q, q_rot, out,
        ring, ring.stride(0), ring.stride(1), ring.stride(2), ring.stride(3),
        slots, pos, swa_start,
        lat, lat.stride(0) if has_lat else 0, lat.stride(1) if has_lat else 0,
        tab, tab.stride(0) if has_lat else 0, cnt,
        ring.shape[2], window, latents.shape[1] if has_lat else 1, 1.0 / math.sqrt(d),
        HQ=hq, G=hq // hkv, D=d, BLOCK_G=next_pow2(hq // hkv), BLOCK_D=next_pow2(d),
        BLOCK_N=BLOCK_N, HAS_LAT=has_lat,
    )  # fmt: skip
    return out.view(b, hq * d)


def paged_decode_attention_reference(
    q: torch.Tensor,
    q_rot: torch.Tensor,
    ring: torch.Tensor,
    slots: torch.Tensor,
    pos: torch.Tensor,
    swa_start: torch.Tensor,
    window: int,
    latents: torch.Tensor | None = None,
    tables: torch.Tensor | None = None,
    count: torch.Tensor | None = None,
) -> torch.Tensor:
    """The torch definition of :func:`paged_decode_attention`: gathered keys, one plain softmax."""
    _check(q, q_rot, ring, slots, pos, swa_start, latents, tables, count)
    b, hq, d = q.shape
    hkv, r = ring.shape[3], ring.shape[2]
    q, q_rot = q.float(), q_rot.float()
    kpos = pos[:, None] - (window - 1) + torch.arange(window, device=pos.device)[None, :]  # [B, W]
    ok = kpos >= swa_start[:, None].clamp(min=0)
    idx = kpos.clamp(min=0) % r
    keys = ring[slots[:, None], 0, idx].float().repeat_interleave(hq // hkv, dim=2)  # [B, W, Hq, D]
    vals = ring[slots[:, None], 1, idx].float().repeat_interleave(hq // hkv, dim=2)
    scale = 1.0 / math.sqrt(d)
    scores = torch.einsum("bhd,bwhd->bhw", q_rot, keys).mul(scale).masked_fill(~ok[:, None, :], float("-inf"))
    if latents is None:
        return torch.einsum("bhw,bwhd->bhd", torch.softmax(scores, -1), vals).reshape(b, hq * d)
    n = max(int(count.max()), 1)
    entries = torch.arange(n, device=pos.device)[None, :].expand(b, n)
    valid = entries < count[:, None]
    page = tables.gather(1, (entries // latents.shape[1]).clamp(max=tables.shape[1] - 1))
    lat = latents[page, entries % latents.shape[1]].float()  # [B, N, D]
    s_lat = torch.einsum("bhd,bnd->bhn", q, lat).mul(scale).masked_fill(~valid[:, None, :], float("-inf"))
    p = torch.softmax(torch.cat([scores, s_lat], -1), -1)
    out = torch.einsum("bhw,bwhd->bhd", p[..., :window], vals) + torch.einsum(
        "bhn,bnd->bhd", p[..., window:], lat
    )
    return out.reshape(b, hq * d)
