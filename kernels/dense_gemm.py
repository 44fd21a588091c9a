"""Dense fp32 products in C with a fixed reduction order: ``x [M, K] @ w [K, N]``.

``dense_gemm.c`` computes every output element as one chain of fused multiply-adds over
k = 0 .. K-1, from zero, so a row's bits depend on that row and the weight alone: not on M, on
the register tile the row falls in, on the CPU's vector width or on the thread count. A batch-
invariant engine gets the same bits for a token in a step of any size without cutting products
into fixed row tiles, and reads each weight once per product::

    pack(w [K, N])            -> Packed: panels [ceil(N / NR)][K][NR] (NR = panel_width(), zero past N)
    gemm(x [M, K], packed)    -> [M, N]; columns shared among torch's thread count, in panels

The threads are those of :mod:`dsi.kernels.thread_pool`, one set per process, so the caller
holds no Python lock while a product runs. Results equal ``x @ w`` to
fp32 rounding, not bit for bit. Where the library cannot be built (see
:mod:`dsi.kernels.native`), ``available()`` is False and callers use their torch path.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from dsi.kernels import thread_pool
from dsi.kernels.native import library, output

_I64, _PTR, _INT = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int


def _lib() -> ctypes.CDLL | None:
    lib = library("dense_gemm")
    if lib is not None and not getattr(lib, "_dsi_typed", False):
        lib.dsi_gemm_panel_width.restype = _I64
        lib.dsi_gemm_panel_width.argtypes = []
        lib.dsi_gemm_pack.restype = None
        lib.dsi_gemm_pack.argtypes = [_PTR, _I64, _I64, _I64, _I64, _PTR]
        lib.dsi_gemm.restype = None
        lib.dsi_gemm.argtypes = [_PTR, _I64, _I64, _I64, _PTR, _I64, _PTR, _I64, _PTR, _INT]
        lib._dsi_typed = True
    return lib


def available() -> bool:
    return _lib() is not None


@dataclass(frozen=True, slots=True)
class Packed:
    """A weight [K, N] packed for :func:`gemm`: ``panels`` fp32 [ceil(N / NR) * K * NR]."""

    panels: torch.Tensor
    k: int
    n: int


def panel_width() -> int:
    """NR: the columns of a panel on this CPU (48 with AVX-512, else 16)."""
    lib = _lib()
    if lib is None:
        raise RuntimeError("the dense_gemm kernel is not built")
    return int(lib.dsi_gemm_panel_width())


def pack(w: torch.Tensor) -> Packed:
    """w fp32 [K, N], any strides (a transposed view included) -> its panels."""
    lib = _lib()
    if lib is None:
        raise RuntimeError("the dense_gemm kernel is not built")
    if w.dim() != 2 or w.dtype != torch.float32 or w.device.type != "cpu":
        raise ValueError(f"pack takes a 2-D fp32 CPU weight, not {tuple(w.shape)} {w.dtype} {w.device}")
    k, n = w.shape
    nr = panel_width()
    panels = torch.empty(-(-n // nr) * k * nr)
    lib.dsi_gemm_pack(w.data_ptr(), k, n, w.stride(0), w.stride(1), panels.data_ptr())
    return Packed(panels, k, n)


def gemm(
    x: torch.Tensor, w: Packed, out: torch.Tensor | None = None, threads: int | None = None
) -> torch.Tensor:
    """x fp32 [M, K] (rows may be strided, columns contiguous) @ the packed weight -> [M, N]
    (``out`` when given: fp32 [M, N] with contiguous rows). ``threads``: how many share the
    columns (default torch's count on this thread)."""
    lib = _lib()
    if lib is None:
        raise RuntimeError("the dense_gemm kernel is not built")
    m, k = x.shape
    if k != w.k or x.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(f"x {tuple(x.shape)} {x.dtype} does not fit a packed [{w.k}, {w.n}] fp32 weight")
    if m and x.stride(1) != 1:
        x = x.contiguous()
    out = output(out, m, w.n)
    run, count = thread_pool.share(threads)
    lib.dsi_gemm(x.data_ptr(), x.stride(0), m, k, w.panels.data_ptr(), w.n, out.data_ptr(), w.n, run, count)
    return out
