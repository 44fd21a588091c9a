"""DeepSeek-V4 attention of query rows over their SWA keys and global latents, each row on its own.

Row r of a step (a decode slice or one position of a prefill chunk) attends to two lists of
keys, named by element offsets into tensors the caller owns (a layer's rings, a chunk's keys, a
page view of latents), so that nothing is gathered first::

    SWA:     j in [swa_lo[r], swa_hi[r]):  key   kbase[swa_off[seq[r], j] + h * head_stride : + D]
                                           value vbase[swa_off[seq[r], j] + h * head_stride : + D]
             (KV head h, read by its query heads' rotated queries q_rot), in position order
    latents: j in [0, lat_n[r]):           key = value  lbase[lat_off[seq[r], j] : + D]
             (read by every head's unrotated query q), in entry order
    q, q_rot [rows, Hq, D]  ->  out [rows, Hq * D]: one softmax over both lists

The C kernel (``v4_attention.c``, built by :mod:`dsi.kernels.native`) computes a row from its own
queries and the keys its lists name, in one fixed order (blocks of 128 keys from each list's
first entry, SWA first): a token gets the same bits in a decode batch of any size and in a
prefill chunk of any length, and a stale ring slot or an unwritten page entry is never read.
:func:`v4_attention_reference` is the torch definition (plain softmax; equal to fp32 rounding).
"""

from __future__ import annotations

import ctypes
import math

import torch

from dsi.kernels.native import library

_I64, _PTR, _F32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float


def _lib() -> ctypes.CDLL | None:
    lib = library("v4_attention")
    if lib is not None and not getattr(lib, "_dsi_typed", False):
        lib.dsi_v4_attention.restype = ctypes.c_int
        lib.dsi_v4_attention.argtypes = [
            *(_PTR, _I64, _PTR, _I64),  # q, q_rot
            *(_I64, _I64, _I64, _I64),  # rows, hq, hkv, d
            *(_PTR, _PTR, _I64, _PTR, _I64, _PTR, _PTR),  # SWA
            *(_PTR, _PTR, _I64, _PTR),  # latents
            *(_PTR, _F32, _PTR),  # seq, scale, out
        ]
        lib.dsi_v4_attention_supports.restype = ctypes.c_int
        lib.dsi_v4_attention_supports.argtypes = [_I64]
        lib._dsi_typed = True
    return lib


def available() -> bool:
    """Whether the C kernel could be built and loaded here."""
    return _lib() is not None


def supports(head_dim: int) -> bool:
    """Whether the C kernel is built here and takes ``head_dim`` (16, 32, 64, 128 or 256; any group)."""
    lib = _lib()
    return lib is not None and bool(lib.dsi_v4_attention_supports(head_dim))


def _reach(base: torch.Tensor) -> int:
    """Elements of base's storage from its first element on."""
    return base.untyped_storage().nbytes() // base.element_size() - base.storage_offset()


def _check(
    q: torch.Tensor,
    q_rot: torch.Tensor,
    hkv: int,
    kbase: torch.Tensor,
    vbase: torch.Tensor,
    head_stride: int,
    swa_off: torch.Tensor,
    swa_lo: torch.Tensor,
    swa_hi: torch.Tensor,
    lbase: torch.Tensor | None,
    lat_off: torch.Tensor | None,
    lat_n: torch.Tensor | None,
    seq: torch.Tensor,
) -> None:
    rows, hq, d = q.shape
    for name, t in (("q", q), ("q_rot", q_rot)):
        if t.shape != (rows, hq, d) or t.dtype != torch.float32 or t.stride(2) != 1 or t.stride(1) != d:
            raise ValueError(f"{name} must be fp32 [{rows}, {hq}, {d}] with its heads contiguous")
    if hkv <= 0 or hq % hkv:
        raise ValueError(f"Hq ({hq}) must be a multiple of Hkv ({hkv})")
    ints = [("swa_off", swa_off), ("swa_lo", swa_lo), ("swa_hi", swa_hi), ("seq", seq)]
    if lat_off is not None:
        ints += [("lat_off", lat_off), ("lat_n", lat_n)]
    for name, t in ints:
        if t is None or t.dtype != torch.long or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous int64 tensor")
    for name, t in (("swa_lo", swa_lo), ("swa_hi", swa_hi), ("seq", seq)) + (
        (("lat_n", lat_n),) if lat_n is not None else ()
    ):
        if t.shape != (rows,):
            raise ValueError(f"{name} must be [rows]")
    if rows == 0:
        return
    lists = swa_off.shape[0]
    if int(seq.min()) < 0 or int(seq.max()) >= lists or (lat_off is not None and lat_off.shape[0] != lists):
        raise ValueError("seq must name a row of swa_off (and of lat_off)")
    if int(swa_lo.min()) < 0 or bool((swa_hi < swa_lo).any()) or int(swa_hi.max()) > swa_off.shape[1]:
        raise ValueError("each row's SWA range must lie in its swa_off row")
    for t in (kbase, vbase) + ((lbase,) if lbase is not None else ()):
        if t.dtype != torch.float32:
            raise ValueError("keys, values and latents must be fp32")
    if swa_off.numel():
        top = int(swa_off.max()) + (hkv - 1) * head_stride + d
        if int(swa_off.min()) < 0 or top > min(_reach(kbase), _reach(vbase)):
            raise ValueError("an SWA offset points outside the keys or values")
    if lat_off is not None:
        if int(lat_n.min()) < 0 or int(lat_n.max()) > lat_off.shape[1]:
            raise ValueError("each row's latent count must lie in its lat_off row")
        if lat_off.numel() and (int(lat_off.min()) < 0 or int(lat_off.max()) + d > _reach(lbase)):
            raise ValueError("a latent offset points outside the latents")


def v4_attention(
    q: torch.Tensor,
    q_rot: torch.Tensor,
    hkv: int,
    kbase: torch.Tensor,
    vbase: torch.Tensor,
    head_stride: int,
    swa_off: torch.Tensor,
    swa_lo: torch.Tensor,
    swa_hi: torch.Tensor,
    lbase: torch.Tensor | None,
    lat_off: torch.Tensor | None,
    lat_n: torch.Tensor | None,
    seq: torch.Tensor,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rows as the module docstring says -> [rows, Hq * D] (written into ``out`` when given: fp32
    with contiguous rows). ``lbase``, ``lat_off``, ``lat_n`` None: no latents. Offsets are
    checked against the tensors' storage. The C kernel where it is built and takes the head dim,
    else the reference."""
    _check(q, q_rot, hkv, kbase, vbase, head_stride, swa_off, swa_lo, swa_hi, lbase, lat_off, lat_n, seq)
    rows, hq, d = q.shape
    if out is not None and (
        out.shape != (rows, hq * d)
        or out.dtype != torch.float32
        or out.stride(1) != 1
        or out.stride(0) != hq * d
    ):
        raise ValueError(f"out must be fp32 [{rows}, {hq * d}] with contiguous rows")
    if not supports(d):
        result = v4_attention_reference(
            q, q_rot, hkv, kbase, vbase, head_stride, swa_off, swa_lo, swa_hi, lbase, lat_off, lat_n, seq
        )
        return result if out is None else out.copy_(result)
    if out is None:
        out = torch.empty(rows, hq * d)
    if rows == 0:
        return out
    if lat_off is None:
        lbase, lat_off, lat_n = kbase, swa_off.new_zeros(swa_off.shape[0], 0), torch.zeros_like(seq)
    _lib().dsi_v4_attention(
        q.data_ptr(), q.stride(0), q_rot.data_ptr(), q_rot.stride(0),
        rows, hq, hkv, d,
        kbase.data_ptr(), vbase.data_ptr(), head_stride, swa_off.data_ptr(), swa_off.shape[1],
        swa_lo.data_ptr(), swa_hi.data_ptr(),
        lbase.data_ptr(), lat_off.data_ptr(), lat_off.shape[1], lat_n.data_ptr(),
        seq.data_ptr(), 1.0 / math.sqrt(d), out.data_ptr(),
    )  # fmt: skip
    return out


def _rows_at(base: torch.Tensor, offsets: torch.Tensor, width: int) -> torch.Tensor:
    """[n, width] rows of base's storage at element offsets [n] from its first element."""
    flat = base.as_strided((_reach(base),), (1,))
    return flat[offsets[:, None] + torch.arange(width)[None, :]]


def v4_attention_reference(
    q: torch.Tensor,
    q_rot: torch.Tensor,
    hkv: int,
    kbase: torch.Tensor,
    vbase: torch.Tensor,
    head_stride: int,
    swa_off: torch.Tensor,
    swa_lo: torch.Tensor,
    swa_hi: torch.Tensor,
    lbase: torch.Tensor | None,
    lat_off: torch.Tensor | None,
    lat_n: torch.Tensor | None,
    seq: torch.Tensor,
) -> torch.Tensor:
    """The torch definition of :func:`v4_attention`: one plain softmax per query row."""
    rows, hq, d = q.shape
    group, scale = hq // hkv, 1.0 / math.sqrt(d)
    out = torch.zeros(rows, hq * d)
    heads = torch.arange(hkv) * head_stride
    for r in range(rows):
        at = swa_off[int(seq[r]), int(swa_lo[r]) : int(swa_hi[r])]
        idx = (at[:, None] + heads[None, :]).reshape(-1)
        k = _rows_at(kbase, idx, d).view(-1, hkv, d).repeat_interleave(group, dim=1)  # [n, Hq, D]
        v = _rows_at(vbase, idx, d).view(-1, hkv, d).repeat_interleave(group, dim=1)
        scores = [torch.einsum("hd,khd->hk", q_rot[r], k)]
        values = [v]
        if lat_off is not None and int(lat_n[r]):
            lat = _rows_at(lbase, lat_off[int(seq[r]), : int(lat_n[r])], d)  # [n, D]
            scores.append(q[r] @ lat.T)
            values.append(lat[:, None, :].expand(-1, hq, d))
        s = torch.cat(scores, dim=1) * scale
        if s.shape[1] == 0:
            continue
        w = torch.softmax(s, dim=-1)
        out[r] = torch.einsum("hk,khd->hd", w, torch.cat(values, dim=0)).reshape(-1)
    return out
