"""Causal attention over Block KV pages for every query row of a step, each row on its own.

One call per layer serves a whole step: decode rows, prefill-chunk rows and verify rows alike.
Row r is a query of sequence ``seq[r]`` at position ``pos[r]``; it attends to positions
0 .. pos[r] of that sequence, read in place from the pages (no gather)::

    kv_layer [num_blocks, 2 (k, v), block, Hkv, D]      position p of sequence s:
                                                         kv_layer[tables[s, p // block], :, p % block]
    q [rows, Hq, D] (rows may be strided)  ->  out [rows, Hq * D]

The C kernel (``paged_attention.c``, built by :mod:`dsi.kernels.native`) computes a query from
its own vector, its pages and its position only, in one fixed order: a token gets the same bits
in a batch of any size and in a prefill chunk of any length, which is what the engine's batch
invariance asks. :func:`paged_attention_reference` is the torch definition (plain softmax; equal
to fp32 rounding). :func:`write_kv` stores a step's keys and values into the pages first.
"""

from __future__ import annotations

import ctypes
import math

import torch

from dsi.kernels import native, thread_pool
from dsi.kernels.native import library

_I64, _PTR, _F32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float


def _lib() -> ctypes.CDLL | None:
    lib = library("paged_attention")
    if lib is not None and not getattr(lib, "_dsi_typed", False):
        lib.dsi_paged_attention.restype = ctypes.c_int
        lib.dsi_paged_attention.argtypes = [_PTR, _I64, _I64, _I64, _I64, _I64]
        lib.dsi_paged_attention.argtypes += [
            _PTR,
            _I64,
            _I64,
            _I64,
            _I64,
            _I64,
            _PTR,
            _I64,
            _PTR,
            _PTR,
            _F32,
            _PTR,
            _PTR,
            ctypes.c_int,
        ]
        lib.dsi_paged_attention_supports.restype = ctypes.c_int
        lib.dsi_paged_attention_supports.argtypes = [_I64, _I64]
        lib.dsi_write_kv.restype = None
        lib.dsi_write_kv.argtypes = [_PTR, _I64, _PTR, _I64, _I64, _I64, _PTR, _I64, _I64, _I64, _PTR, _PTR]
        lib._dsi_typed = True
    return lib


def available() -> bool:
    """Whether the C kernel could be built and loaded here."""
    return _lib() is not None


def supports(group: int, head_dim: int) -> bool:
    """Whether the C kernel is built here and has a variant for ``group`` query heads per KV head
    of ``head_dim`` (group 1, 2, 3, 4 or 8 at D 64; 1, 2 or 4 at D 128 and 256)."""
    lib = _lib()
    return lib is not None and bool(lib.dsi_paged_attention_supports(group, head_dim))


def _check_pages(kv_layer: torch.Tensor) -> None:
    if kv_layer.dim() != 5 or kv_layer.shape[1] != 2 or kv_layer.dtype != torch.float32:
        raise ValueError(f"kv_layer must be fp32 [num_blocks, 2, block, Hkv, D], got {tuple(kv_layer.shape)}")
    if kv_layer.stride(4) != 1 or kv_layer.stride(3) != kv_layer.shape[4]:
        raise ValueError("kv_layer's heads and head dims must be contiguous")


def _check_rows(q: torch.Tensor, kv_layer: torch.Tensor, tables, seq, pos) -> None:
    _check_pages(kv_layer)
    if q.dim() != 3 or q.dtype != torch.float32 or q.stride(2) != 1 or q.stride(1) != q.shape[2]:
        raise ValueError("q must be fp32 [rows, Hq, D] with its heads contiguous")
    if q.shape[2] != kv_layer.shape[4] or q.shape[1] % kv_layer.shape[3]:
        raise ValueError("q's head dim must be the pages' and Hq a multiple of Hkv")
    for name, t in (("tables", tables), ("seq", seq), ("pos", pos)):
        if t.dtype != torch.long or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous int64 tensor")
    if tables.dim() != 2 or seq.shape != (q.shape[0],) or pos.shape != (q.shape[0],):
        raise ValueError("tables must be [seqs, width], seq and pos [rows]")


def paged_attention(
    q: torch.Tensor,
    kv_layer: torch.Tensor,
    tables: torch.Tensor,
    seq: torch.Tensor,
    pos: torch.Tensor,
    out: torch.Tensor | None = None,
    threads: int = 1,
) -> torch.Tensor:
    """q [rows, Hq, D] over pages kv_layer [num_blocks, 2, block, Hkv, D]; tables [seqs, W] (int64),
    seq [rows], pos [rows] (a row with pos < 0 gets zeros). -> [rows, Hq * D] (written into ``out``
    when given: fp32 with contiguous rows, such as a row range of a larger result). The C kernel
    where it is built and has a variant for the shape, else the reference. ``threads``: how many
    threads of :mod:`dsi.kernels.thread_pool` share the rows (a row's bits are the same)."""
    _check_rows(q, kv_layer, tables, seq, pos)
    rows, hq, d = q.shape
    out = native.output(out, rows, hq * d)
    if not supports(hq // kv_layer.shape[3], d):
        return out.copy_(paged_attention_reference(q, kv_layer, tables, seq, pos))
    lib = _lib()
    st = kv_layer.stride()
    rc = lib.dsi_paged_attention(
        q.data_ptr(), q.stride(0), rows, hq, kv_layer.shape[3], d,
        kv_layer.data_ptr(), st[1], st[0], st[2], st[3], kv_layer.shape[2],
        tables.data_ptr(), tables.shape[1], seq.data_ptr(), pos.data_ptr(), 1.0 / math.sqrt(d),
        out.data_ptr(), *thread_pool.share(threads),
    )  # fmt: skip
    if rc:
        raise ValueError(
            f"paged_attention: a page of {kv_layer.shape[2]} tokens is more than the kernel takes"
        )
    return out


def paged_attention_reference(
    q: torch.Tensor, kv_layer: torch.Tensor, tables: torch.Tensor, seq: torch.Tensor, pos: torch.Tensor
) -> torch.Tensor:
    """The torch definition of :func:`paged_attention`: one plain softmax per query row."""
    rows, hq, d = q.shape
    block, hkv = kv_layer.shape[2], kv_layer.shape[3]
    out = torch.zeros(rows, hq * d)
    for r in range(rows):
        p = int(pos[r])
        if p < 0:
            continue
        at = torch.arange(p + 1)
        pages = tables[int(seq[r])][at // block]
        k = kv_layer[pages, 0, at % block].repeat_interleave(hq // hkv, dim=1)  # [p + 1, Hq, D]
        v = kv_layer[pages, 1, at % block].repeat_interleave(hq // hkv, dim=1)
        w = torch.softmax(torch.einsum("hd,khd->hk", q[r], k) / math.sqrt(d), dim=-1)
        out[r] = torch.einsum("hk,khd->hd", w, v).reshape(-1)
    return out


def write_kv(
    kv_layer: torch.Tensor, k: torch.Tensor, v: torch.Tensor, page: torch.Tensor, off: torch.Tensor
) -> None:
    """k, v [rows, Hkv * D] (rows may be strided) into kv_layer at (page [rows], off [rows]) (int64);
    rows with page < 0 are skipped."""
    lib = _lib()
    if lib is None:
        write_kv_reference(kv_layer, k, v, page, off)
        return
    _check_pages(kv_layer)
    width = kv_layer.shape[3] * kv_layer.shape[4]
    for t in (k, v):
        if t.dim() != 2 or t.shape != (page.shape[0], width) or t.stride(1) != 1 or t.dtype != torch.float32:
            raise ValueError(f"k and v must be fp32 [rows, {width}] with contiguous rows")
    if (
        page.dtype != torch.long
        or off.dtype != torch.long
        or not (page.is_contiguous() and off.is_contiguous())
    ):
        raise ValueError("page and off must be contiguous int64 tensors")
    st = kv_layer.stride()
    lib.dsi_write_kv(
        k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0), k.shape[0], width,
        kv_layer.data_ptr(), st[1], st[0], st[2], page.data_ptr(), off.data_ptr(),
    )  # fmt: skip


def write_kv_reference(
    kv_layer: torch.Tensor, k: torch.Tensor, v: torch.Tensor, page: torch.Tensor, off: torch.Tensor
) -> None:
    """The torch definition of :func:`write_kv`."""
    keep = page >= 0
    shape = (-1, kv_layer.shape[3], kv_layer.shape[4])
    kv_layer[page[keep], 0, off[keep]] = k[keep].reshape(shape)
    kv_layer[page[keep], 1, off[keep]] = v[keep].reshape(shape)
