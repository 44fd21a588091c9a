"""The ratio-2 compressor of the V4 shape for a decode step: one new token per sequence.

A KV-source layer pools token pairs (2j, 2j + 1) into one latent ``x_2j @ wc0 + x_2j+1 @ wc1``.
A decode token at an even position opens its pair (the half product goes to the sequence's
partial state); one at an odd position closes it (the latent goes to its page)::

    row b (state slot slots[b], position pos[b], normalised hidden x[b]):
      pos even:                       partial[slots[b]] = x[b] @ wc0
      pos odd, pos - 1 >= protect[b]: latents[tables[b, j // per_block], j % per_block]
                                          = partial[slots[b]] + x[b] @ wc1,   j = (pos - 1) / 2
      pos odd, pos - 1 < protect[b]:  nothing (a loaded pair keeps its cached latent)

    x [B, H]    wc0, wc1 [H, D]    partial [slots, D] (this source; may be strided)
    latents [num_blocks, per_block, D] (a page view; may be strided)    tables [B, W] int64

:func:`compress_decode` is the Triton kernel (one program per row and block of D, written in
place); :func:`compress_decode_reference` is the torch definition.
"""

from __future__ import annotations

import torch

from dsi.kernels.triton_lang import jit, next_pow2, require, tl

BLOCK_D = 64
BLOCK_H = 32


@jit
def _compress_decode_kernel(
    x_ptr, s_x, wc0_ptr, wc1_ptr, s_w,
    partial_ptr, s_partial, lat_ptr, s_page, s_entry,
    tables_ptr, s_table, slots_ptr, pos_ptr, protect_ptr,
    H, D, per_block,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dm = d < D
    pos = tl.load(pos_ptr + b)
    slot = tl.load(slots_ptr + b)
    even = pos % 2 == 0
    odd = pos % 2 == 1
    acc = tl.zeros([BLOCK_D], tl.float32)
    for h0 in range(0, H, BLOCK_H):
        hh = h0 + tl.arange(0, BLOCK_H)
        hm = hh < H
        x = tl.load(x_ptr + b * s_x + hh, mask=hm, other=0.0).to(tl.float32)
        at = hh[:, None] * s_w + d[None, :]
        wm = hm[:, None] & dm[None, :]
        w = tl.load(wc0_ptr + at, mask=wm & even, other=0.0).to(tl.float32)
        w += tl.load(wc1_ptr + at, mask=wm & odd, other=0.0).to(tl.float32)
        acc += tl.sum(x[:, None] * w, axis=0)
    state = partial_ptr + slot * s_partial + d
    tl.store(state, acc, mask=dm & even)
    closes = odd & (pos - 1 >= tl.load(protect_ptr + b))
    j = (pos - 1) // 2
    page = tl.load(tables_ptr + b * s_table + j // per_block, mask=closes, other=0)
    opened = tl.load(state, mask=dm & closes, other=0.0).to(tl.float32)
    tl.store(lat_ptr + page * s_page + (j % per_block) * s_entry + d, opened + acc, mask=dm & closes)


def _check(x, wc0, wc1, partial, latents, tables, slots, pos, protect) -> None:
    b, h = x.shape
    d = wc0.shape[1]
    if wc0.shape != (h, d) or wc1.shape != (h, d) or x.stride(1) != 1:
        raise ValueError("x must be [B, H] (rows contiguous) and wc0, wc1 [H, D]")
    if partial.dim() != 2 or partial.shape[1] != d or partial.stride(1) != 1:
        raise ValueError("partial must be [slots, D] with D contiguous")
    if latents.dim() != 3 or latents.shape[2] != d or latents.stride(2) != 1:
        raise ValueError("latents must be a [num_blocks, per_block, D] page view with D contiguous")
    if tables.dim() != 2 or tables.shape[0] != b or tables.dtype != torch.long:
        raise ValueError("tables must be int64 [B, W]")
    for name, t in (("slots", slots), ("pos", pos), ("protect", protect)):
        if t.shape != (b,) or t.dtype != torch.long:
            raise ValueError(f"{name} must be int64 [B]")


def compress_decode(
    x: torch.Tensor,
    wc0: torch.Tensor,
    wc1: torch.Tensor,
    partial: torch.Tensor,
    latents: torch.Tensor,
    tables: torch.Tensor,
    slots: torch.Tensor,
    pos: torch.Tensor,
    protect: torch.Tensor,
) -> None:
    """The Triton kernel: ``partial`` and ``latents`` updated in place (see the module docstring)."""
    _check(x, wc0, wc1, partial, latents, tables, slots, pos, protect)
    require(x, "compress_decode")
    b, h = x.shape
    d = wc0.shape[1]
    if b == 0:
        return
    wc0, wc1, tables = wc0.contiguous(), wc1.contiguous(), tables.contiguous()
    block_d = min(BLOCK_D, next_pow2(d))
    _compress_decode_kernel[(b, -(-d // block_d))](
        x, x.stride(0), wc0, wc1, wc0.stride(0),
        partial, partial.stride(0), latents, latents.stride(0), latents.stride(1),
        tables, tables.stride(0), slots, pos, protect,
        h, d, latents.shape[1],
        BLOCK_H=min(BLOCK_H, next_pow2(h)), BLOCK_D=block_d,
    )  # fmt: skip


def compress_decode_reference(
    x: torch.Tensor,
    wc0: torch.Tensor,
    wc1: torch.Tensor,
    partial: torch.Tensor,
    latents: torch.Tensor,
    tables: torch.Tensor,
    slots: torch.Tensor,
    pos: torch.Tensor,
    protect: torch.Tensor,
) -> None:
    """The torch definition of :func:`compress_decode`."""
    _check(x, wc0, wc1, partial, latents, tables, slots, pos, protect)
    x = x.float()
    closes = (pos % 2 == 1) & (pos - 1 >= protect)
    j = (pos - 1) // 2
    per = latents.shape[1]
    page = tables.gather(1, (j.clamp(min=0) // per)[:, None])[:, 0]
    opened = partial[slots[closes]].float() + x[closes] @ wc1.float()
    latents[page[closes], j[closes] % per] = opened.to(latents.dtype)
    even = pos % 2 == 0
    partial[slots[even]] = (x[even] @ wc0.float()).to(partial.dtype)
