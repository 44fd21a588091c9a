"""Triton where it is installed, for the kernel files of this package.

``triton`` and ``tl`` are the modules, or None where Triton is not installed; ``jit`` is
``triton.jit``, or there a decorator that leaves the function as plain Python (never called: the
wrappers ask :func:`runs_here` first). A kernel runs on a CUDA tensor, or on a CPU tensor when
Triton's interpreter is on (``TRITON_INTERPRET=1`` in the environment before Triton is imported;
fp32 and fp16 only: the interpreter computes bf16 wrongly), which is how the tests check the
kernels against their torch references on a machine without a GPU.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the kernels' torch references still work
    triton = None
    tl = None


def jit(fn: Callable[..., Any]) -> Any:
    return triton.jit(fn) if triton is not None else fn


def interpreting() -> bool:
    """Whether Triton's interpreter runs the kernels (on the CPU)."""
    return triton is not None and os.environ.get("TRITON_INTERPRET") == "1"


def runs_here(t: torch.Tensor) -> bool:
    """Whether a Triton kernel can run on tensors on ``t``'s device."""
    return triton is not None and (t.device.type == "cuda" or (interpreting() and t.device.type == "cpu"))


def require(t: torch.Tensor, kernel: str) -> None:
    """Raise a clear error when ``kernel`` cannot run on ``t``'s device here."""
    if triton is None:
        raise RuntimeError(f"{kernel}: Triton is not installed (use the torch reference)")
    if not runs_here(t):
        raise RuntimeError(
            f"{kernel}: Triton runs on CUDA tensors, or on CPU tensors with TRITON_INTERPRET=1; "
            f"got a {t.device.type} tensor (use the torch reference)"
        )


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())
