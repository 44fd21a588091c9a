"""Row-wise ops of a dense step in C: RMSNorm, SiLU(gate) * up, and the rotary embedding.

Each op computes a row from that row alone, in one fixed order (``row_ops.c``), so a token gets
the same bits in a step of any size: what the engine's batch invariance asks. Shapes::

    rms_norm(x [T, H] (rows may be strided), w [H], eps)       -> [T, H]
    silu_mul(gu [T, 2F] = [gate | up] (rows may be strided))    -> [T, F]
    rope_(x [T, heads, D] (rows may be strided), cos, sin [T, D/2])   x rotated in place

They equal the torch formulas (``F.rms_norm``, ``F.silu(g) * u``, :func:`dsi.model.ops.rope_rotate`)
to fp32 rounding, not bit for bit. Each falls back to its torch formula where the library cannot
be built (see :mod:`dsi.kernels.native`) or a width is not a multiple of 16 (32 for rope's D).
Rows are shared among ``threads`` threads of :mod:`dsi.kernels.thread_pool` (default torch's
count; at least 8 rows each), which cannot change a row's bits.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from dsi.kernels import thread_pool
from dsi.kernels.native import library, output

_I64, _PTR, _F32, _INT = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_int
LANES = 16


def _lib() -> ctypes.CDLL | None:
    lib = library("row_ops")
    if lib is not None and not getattr(lib, "_dsi_typed", False):
        lib.dsi_rms_norm.restype = None
        lib.dsi_rms_norm.argtypes = [_PTR, _I64, _I64, _I64, _PTR, _F32, _PTR, _PTR, _INT]
        lib.dsi_silu_mul.restype = None
        lib.dsi_silu_mul.argtypes = [_PTR, _I64, _I64, _I64, _PTR, _PTR, _INT]
        lib.dsi_rope.restype = None
        lib.dsi_rope.argtypes = [_PTR, _I64, _I64, _I64, _I64, _PTR, _PTR, _PTR, _INT]
        lib._dsi_typed = True
    return lib


def _rows_ok(x: torch.Tensor, width: int) -> bool:
    return x.dtype == torch.float32 and x.stride(-1) == 1 and width % LANES == 0 and x.device.type == "cpu"


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    threads: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [T, H] -> x / sqrt(mean(x^2) + eps) * weight, [T, H] contiguous (``out``, fp32 [T, H]
    with contiguous rows, where the C kernel runs: a caller's reused buffer)."""
    t, h = x.shape
    lib = _lib()
    if lib is None or not _rows_ok(x, h) or not weight.is_contiguous():
        return F.rms_norm(x, (h,), weight, eps)
    out = output(out, t, h)
    lib.dsi_rms_norm(
        x.data_ptr(), x.stride(0), t, h, weight.data_ptr(), eps, out.data_ptr(), *thread_pool.share(threads)
    )
    return out


def silu_mul(gu: torch.Tensor, threads: int | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """gu [T, 2F] = [gate | up] -> silu(gate) * up, [T, F] contiguous (``out``, fp32 [T, F] with
    contiguous rows, where the C kernel runs)."""
    t, two_f = gu.shape
    f = two_f // 2
    lib = _lib()
    if lib is None or not _rows_ok(gu, f):
        return F.silu(gu[:, :f]) * gu[:, f:]
    out = output(out, t, f)
    lib.dsi_silu_mul(gu.data_ptr(), gu.stride(0), t, f, out.data_ptr(), *thread_pool.share(threads))
    return out


def rope_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, threads: int | None = None) -> torch.Tensor:
    """x [T, heads, D] rotated in place by cos, sin [T, D/2] (or [T, 1, D/2]); returns x. The
    halves layout of :func:`dsi.model.ops.rope_rotate`."""
    t, heads, d = x.shape
    cos, sin = cos.reshape(t, d // 2), sin.reshape(t, d // 2)
    lib = _lib()
    ok = _rows_ok(x, d // 2) and x.stride(1) == d and cos.is_contiguous() and sin.is_contiguous()
    if lib is None or not ok:
        half = d // 2
        x1, x2 = x[..., :half].clone(), x[..., half:].clone()
        c, s = cos[:, None, :], sin[:, None, :]
        x[..., :half] = x1 * c - x2 * s
        x[..., half:] = x2 * c + x1 * s
        return x
    lib.dsi_rope(
        x.data_ptr(), x.stride(0), t, heads, d, cos.data_ptr(), sin.data_ptr(), *thread_pool.share(threads)
    )
    return x
