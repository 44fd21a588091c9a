"""DeepSeek-V4 attention of query rows over their SWA keys and global latents, each row on its own.

Row r of a step (a decode slice or one position of a prefill chunk) attends to two lists of
keys, named by element offsets into tensors the caller owns (a layer's rings, a chunk's keys, a
page view of latents), so that nothing is gathered first::

    (KeyLists)
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
from dataclasses import dataclass, replace

import torch

from dsi.kernels import native
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


@dataclass(frozen=True, slots=True)
class KeyLists:
    """What each query row attends to, as the module docstring says. ``kbase``, ``vbase``: the
    tensors SWA offsets count from (KV head h at ``+ h * head_stride``); ``swa_off`` [lists, W]
    and ``lat_off`` [lists, N] (int64 element offsets), one row per sequence; ``swa_lo``,
    ``swa_hi``, ``lat_n``, ``seq`` [rows]. ``lbase``, ``lat_off``, ``lat_n`` None: no latents."""

    hkv: int
    kbase: torch.Tensor
    vbase: torch.Tensor
    head_stride: int
    swa_off: torch.Tensor
    swa_lo: torch.Tensor
    swa_hi: torch.Tensor
    seq: torch.Tensor
    lbase: torch.Tensor | None = None
    lat_off: torch.Tensor | None = None
    lat_n: torch.Tensor | None = None

    def rows(self, a: int, b: int) -> KeyLists:
        """The lists of rows a .. b - 1 (the per-sequence offsets shared)."""
        return replace(
            self,
            swa_lo=self.swa_lo[a:b],
            swa_hi=self.swa_hi[a:b],
            seq=self.seq[a:b],
            lat_n=None if self.lat_n is None else self.lat_n[a:b],
        )

    def check(self, rows: int, d: int) -> None:
        """ValueError unless every offset the kernel would follow for ``rows`` rows of ``d``
        values lies in its tensor's storage."""
        ints = [
            ("swa_off", self.swa_off),
            ("swa_lo", self.swa_lo),
            ("swa_hi", self.swa_hi),
            ("seq", self.seq),
        ]
        if self.lat_off is not None:
            ints += [("lat_off", self.lat_off), ("lat_n", self.lat_n)]
        for name, t in ints:
            if t is None or t.dtype != torch.long or not t.is_contiguous():
                raise ValueError(f"{name} must be a contiguous int64 tensor")
        for name, t in ints[1:4] + ints[5:]:
            if t.shape != (rows,):
                raise ValueError(f"{name} must be [rows]")
        if rows == 0:
            return
        lists = self.swa_off.shape[0]
        if (
            int(self.seq.min()) < 0
            or int(self.seq.max()) >= lists
            or (self.lat_off is not None and self.lat_off.shape[0] != lists)
        ):
            raise ValueError("seq must name a row of swa_off (and of lat_off)")
        lo, hi = self.swa_lo, self.swa_hi
        if int(lo.min()) < 0 or bool((hi < lo).any()) or int(hi.max()) > self.swa_off.shape[1]:
            raise ValueError("each row's SWA range must lie in its swa_off row")
        for t in (self.kbase, self.vbase) + ((self.lbase,) if self.lbase is not None else ()):
            if t.dtype != torch.float32:
                raise ValueError("keys, values and latents must be fp32")
        if self.swa_off.numel():
            top = int(self.swa_off.max()) + (self.hkv - 1) * self.head_stride + d
            if int(self.swa_off.min()) < 0 or top > min(_reach(self.kbase), _reach(self.vbase)):
                raise ValueError("an SWA offset points outside the keys or values")
        if self.lat_off is not None:
            if int(self.lat_n.min()) < 0 or int(self.lat_n.max()) > self.lat_off.shape[1]:
                raise ValueError("each row's latent count must lie in its lat_off row")
            off = self.lat_off
            if off.numel() and (int(off.min()) < 0 or int(off.max()) + d > _reach(self.lbase)):
                raise ValueError("a latent offset points outside the latents")


def v4_attention(
    q: torch.Tensor, q_rot: torch.Tensor, keys: KeyLists, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Rows q, q_rot [rows, Hq, D] over their ``keys`` -> [rows, Hq * D] (written into ``out``
    when given: fp32 with contiguous rows). Offsets are checked against the tensors' storage
    first. The C kernel where it is built and takes the head dim, else the reference."""
    rows, hq, d = q.shape
    for name, t in (("q", q), ("q_rot", q_rot)):
        if t.shape != (rows, hq, d) or t.dtype != torch.float32 or t.stride(2) != 1 or t.stride(1) != d:
            raise ValueError(f"{name} must be fp32 [{rows}, {hq}, {d}] with its heads contiguous")
    if keys.hkv <= 0 or hq % keys.hkv:
        raise ValueError(f"Hq ({hq}) must be a multiple of Hkv ({keys.hkv})")
    keys.check(rows, d)
    out = native.output(out, rows, hq * d)
    if not supports(d):
        return out.copy_(v4_attention_reference(q, q_rot, keys))
    if rows == 0:
        return out
    k = keys
    lbase, lat_off, lat_n = k.lbase, k.lat_off, k.lat_n
    if lat_off is None:
        lbase, lat_off, lat_n = k.kbase, k.swa_off.new_zeros(k.swa_off.shape[0], 0), torch.zeros_like(k.seq)
    _lib().dsi_v4_attention(
        q.data_ptr(), q.stride(0), q_rot.data_ptr(), q_rot.stride(0),
        rows, hq, k.hkv, d,
        k.kbase.data_ptr(), k.vbase.data_ptr(), k.head_stride, k.swa_off.data_ptr(), k.swa_off.shape[1],
        k.swa_lo.data_ptr(), k.swa_hi.data_ptr(),
        lbase.data_ptr(), lat_off.data_ptr(), lat_off.shape[1], lat_n.data_ptr(),
        k.seq.data_ptr(), 1.0 / math.sqrt(d), out.data_ptr(),
    )  # fmt: skip
    return out


def _rows_at(base: torch.Tensor, offsets: torch.Tensor, width: int) -> torch.Tensor:
    """[n, width] rows of base's storage at element offsets [n] from its first element."""
    flat = base.as_strided((_reach(base),), (1,))
    return flat[offsets[:, None] + torch.arange(width)[None, :]]


def v4_attention_reference(q: torch.Tensor, q_rot: torch.Tensor, keys: KeyLists) -> torch.Tensor:
    """The torch definition of :func:`v4_attention`: one plain softmax per query row."""
    rows, hq, d = q.shape
    k = keys
    group, scale = hq // k.hkv, 1.0 / math.sqrt(d)
    out = torch.zeros(rows, hq * d)
    heads = torch.arange(k.hkv) * k.head_stride
    for r in range(rows):
        at = k.swa_off[int(k.seq[r]), int(k.swa_lo[r]) : int(k.swa_hi[r])]
        idx = (at[:, None] + heads[None, :]).reshape(-1)
        kk = _rows_at(k.kbase, idx, d).view(-1, k.hkv, d).repeat_interleave(group, dim=1)  # [n, Hq, D]
        v = _rows_at(k.vbase, idx, d).view(-1, k.hkv, d).repeat_interleave(group, dim=1)
        scores, values = [torch.einsum("hd,khd->hk", q_rot[r], kk)], [v]
        if k.lat_off is not None and int(k.lat_n[r]):
            lat = _rows_at(k.lbase, k.lat_off[int(k.seq[r]), : int(k.lat_n[r])], d)  # [n, D]
            scores.append(q[r] @ lat.T)
            values.append(lat[:, None, :].expand(-1, hq, d))
        s = torch.cat(scores, dim=1) * scale
        if s.shape[1] == 0:
            continue
        w = torch.softmax(s, dim=-1)
        out[r] = torch.einsum("hk,khd->hd", w, torch.cat(values, dim=0)).reshape(-1)
    return out
