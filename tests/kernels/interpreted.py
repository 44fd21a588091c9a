"""Kernel modules with their Triton kernels run by Triton's interpreter, on the CPU."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def interpreted(name: str) -> ModuleType:
    """``dsi.kernels.<name>`` with its kernels wrapped for the interpreter (skips without Triton).
    ``triton.jit`` picks the interpreter when a kernel is defined, so the module is reloaded after
    ``TRITON_INTERPRET=1`` is set, in case something imported it before."""
    os.environ["TRITON_INTERPRET"] = "1"
    pytest.importorskip("triton", reason="Triton is not installed")
    return importlib.reload(importlib.import_module(f"dsi.kernels.{name}"))
