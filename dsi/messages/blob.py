"""Blob: a tensor or byte buffer that travels as its own zero-copy ZeroMQ frame.

A message field typed ``Blob`` is never serialised into the msgpack body. The encoder puts the
buffer in an extra frame and writes a small extension record ``[frame index, dtype, shape]`` in
its place; the decoder turns that record back into a ``Blob`` whose memory *is* the received
frame. Sending and receiving copy nothing in user space.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

# dtypes numpy has no name for travel as raw bytes and are reinterpreted by torch.
_TORCH_ONLY = {"bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}


class Blob:
    """A contiguous buffer plus dtype and shape.

    ``buffer`` is anything exposing the buffer protocol (``memoryview``, ``zmq.Frame``,
    ``bytes``). ``dtype`` is a numpy or torch dtype name; ``shape`` is in elements.
    """

    __slots__ = ("_owner", "buffer", "dtype", "shape")

    def __init__(
        self, buffer: Any, dtype: str = "uint8", shape: tuple[int, ...] | None = None, owner: Any = None
    ) -> None:
        view = memoryview(buffer)
        self.buffer = view if view.format == "B" and view.ndim == 1 else view.cast("B")
        self.dtype = dtype
        self.shape = tuple(shape) if shape is not None else (self.buffer.nbytes // _itemsize(dtype),)
        self._owner = owner  # keeps the source object (a tensor, a zmq.Frame) alive
        if any(n < 0 for n in self.shape) or _itemsize(dtype) * math.prod(self.shape) != self.buffer.nbytes:
            raise ValueError(f"blob of {self.buffer.nbytes} bytes cannot hold {dtype}{list(self.shape)}")

    @classmethod
    def of(cls, obj: Any) -> Blob:
        """Wrap a numpy array, a CPU torch tensor or a bytes-like object without copying."""
        if isinstance(obj, np.ndarray):
            arr = np.ascontiguousarray(obj)
            if arr is not obj and obj.size:
                raise ValueError("Blob.of needs a contiguous array (a copy would be hidden)")
            return cls(arr.reshape(-1).view(np.uint8), str(arr.dtype), arr.shape, owner=arr)
        if type(obj).__module__.startswith("torch"):
            return _from_torch(cls, obj)
        return cls(obj)

    @property
    def nbytes(self) -> int:
        return self.buffer.nbytes

    def numpy(self) -> np.ndarray:
        """A numpy view of the buffer (read-only when the frame is)."""
        if self.dtype in _TORCH_ONLY:
            raise TypeError(f"{self.dtype} has no numpy dtype; use .torch()")
        return np.frombuffer(self.buffer, dtype=self.dtype).reshape(self.shape)

    def torch(self) -> Any:
        """A torch view of the buffer (shares memory; read-only when the frame is)."""
        import torch

        dtype = getattr(torch, self.dtype)
        if self.buffer.nbytes == 0:
            return torch.empty(self.shape, dtype=dtype)
        with warnings.catch_warnings():  # received frames are read-only; callers must not write
            warnings.simplefilter("ignore", UserWarning)
            return torch.frombuffer(self.buffer, dtype=dtype).reshape(self.shape)

    def address(self) -> int:
        """Address of the first byte: lets tests prove that two views share memory."""
        return np.frombuffer(self.buffer, dtype=np.uint8).ctypes.data if self.nbytes else 0

    def __repr__(self) -> str:
        return f"Blob({self.dtype}{list(self.shape)}, {self.nbytes} B)"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Blob)
            and self.dtype == other.dtype
            and self.shape == other.shape
            and self.buffer == other.buffer
        )


def _itemsize(dtype: str) -> int:
    return _TORCH_ONLY.get(dtype) or np.dtype(dtype).itemsize


def _from_torch(cls: type[Blob], tensor: Any) -> Blob:
    if tensor.device.type != "cpu":
        raise ValueError("Blob.of takes CPU tensors; device memory moves over the KV data plane")
    if not tensor.is_contiguous():
        raise ValueError("Blob.of needs a contiguous tensor (a copy would be hidden)")
    dtype = str(tensor.dtype).removeprefix("torch.")
    flat = tensor.detach().reshape(-1)
    raw = flat.view(__import__("torch").uint8) if flat.numel() else flat
    return cls(raw.numpy() if raw.numel() else b"", dtype, tuple(tensor.shape), owner=tensor)
