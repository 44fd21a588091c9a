"""Where an engine computes (``[engine] device``), and which kernels run its decode hot paths there.

``device`` is any torch device string: "cpu", "cuda", "cuda:1", ... :func:`parse_device` reads
one (an error names the key); :func:`resolve_device` also checks that the device exists on this
machine, when an engine starts. The runner puts its weights, Block KV pages, SWA rings and
compressor state there.

:func:`decode_kernels` is the one dispatch point between the Triton kernels of ``dsi.kernels``
and the torch paths: on CUDA it hands the runner the kernels of a decode step (attention over
the pages and the SWA ring, the compressor, the MoE gate); elsewhere None, and the runner keeps
its torch / C path (batch-invariant on the CPU). The kernel modules are imported only then, so
a machine without Triton never imports them.

:func:`copy_stream` gives a CUDA device a stream for copies beside the compute stream (the
layer-wise load of prefix-hit pages, :mod:`dsi.engine.hit_load`); elsewhere None: a CPU copy is
plain host work on the copier's thread.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

KEY = "[engine] device"
# torch's own device types (c10's DeviceType names): a config naming one of these is checked
# without importing torch, so roles that never compute (controller, gateway, kvstore,
# balancer) read their config without the second or so of CPU that importing torch costs.
# Any other name (an out-of-tree backend's renamed privateuse1, e.g. "npu") is asked of torch.
_TORCH_TYPES = frozenset(
    [
        "cpu",
        "cuda",
        "ipu",
        "xpu",
        "mkldnn",
        "opengl",
        "opencl",
        "ideep",
        "hip",
        "ve",
        "fpga",
        "maia",
        "xla",
        "lazy",
        "vulkan",
        "mps",
        "meta",
        "hpu",
        "mtia",
        "privateuseone",
    ]
)
_SYNTAX = re.compile(r"([a-z_][a-z0-9_]*)(?::(0|[1-9][0-9]*))?")


def parse_device(text: str) -> Any:
    """A torch device from its string; ValueError naming the key when torch does not know it."""
    import torch

    try:
        return torch.device(text)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"{KEY} = {text!r} is not a torch device (e.g. 'cpu', 'cuda', 'cuda:1')") from None


def device_problem(text: str) -> str | None:
    """Why ``text`` names no device this config could use, or None (a config check: syntax only,
    a config is read on machines other than the one that runs it)."""
    found = _SYNTAX.fullmatch(text)
    if found is not None and found.group(1) in _TORCH_TYPES:
        return None
    try:
        parse_device(text)
    except ValueError:
        return f"must be a torch device such as 'cpu', 'cuda' or 'cuda:1', got {text!r}"
    return None


def resolve_device(text: str) -> Any:
    """The torch device of ``text`` when it exists here; ValueError naming the key otherwise."""
    import torch

    device = parse_device(text)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"{KEY} = {text!r}: this machine has no CUDA device (torch {torch.__version__})")
        if device.index is not None and device.index >= count:
            raise ValueError(f"{KEY} = {text!r}: this machine has {count} CUDA device(s)")
        return torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
    if device.type not in ("cpu", "meta"):
        try:
            torch.empty(1, device=device)
        except (RuntimeError, AssertionError) as exc:
            raise ValueError(f"{KEY} = {text!r} is not available here: {exc}") from None
    return device


@dataclass(slots=True, frozen=True)
class DecodeKernels:
    """The Triton kernels of a decode step (signatures: their modules in ``dsi.kernels``)."""

    attention: Callable[..., Any]  # dsi.kernels.decode_attention.paged_decode_attention
    compress: Callable[..., Any]  # dsi.kernels.compressor.compress_decode
    gate: Callable[..., Any]  # dsi.kernels.moe_gate.moe_gate


def decode_kernels(device: Any) -> DecodeKernels | None:
    """The Triton kernels on a CUDA device, else None (the torch references' paths)."""
    if device.type != "cuda":
        return None
    from dsi.kernels import triton_lang

    if triton_lang.triton is None:
        raise ValueError(f"{KEY} = {str(device)!r} needs Triton for its kernels, and Triton is not installed")
    from dsi.kernels.compressor import compress_decode
    from dsi.kernels.decode_attention import paged_decode_attention
    from dsi.kernels.moe_gate import moe_gate

    return DecodeKernels(paged_decode_attention, compress_decode, moe_gate)


class CopyStream:
    """Copies queued on a side stream of a CUDA device, each batch ending in an event that the
    compute stream can wait on without blocking the host."""

    def __init__(self, device: Any) -> None:
        import torch

        self.device = device
        self.stream = torch.cuda.Stream(device)

    def run(self, copies: Callable[[], None]) -> Any:
        """Queue ``copies`` (torch copies) on the side stream; the event recorded after them."""
        import torch

        with torch.cuda.stream(self.stream):
            copies()
            event = torch.cuda.Event()
            event.record(self.stream)
        return event

    def wait(self, event: Any) -> None:
        """Work queued on the compute stream from now on runs after ``event``."""
        import torch

        torch.cuda.current_stream(self.device).wait_event(event)


def copy_stream(device: Any) -> CopyStream | None:
    """A side stream for copies on a CUDA device, else None (the CPU copies on a host thread)."""
    return CopyStream(device) if device.type == "cuda" else None
