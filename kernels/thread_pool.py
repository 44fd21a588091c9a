"""The compute threads dsi's C kernels share their work among (``thread_pool.c``).

One pool per process: ``dsi_pool_run(part, ctx, parts)`` runs a kernel's parts on the calling
thread and ``parts - 1`` workers of the pool's own (pthreads, started on first need; a forked
child starts its own). Kernels take its address as an argument (``run_pointer()``), so each
kernel library stays a file of its own and all of them share one set of threads. No Python runs
on a worker, and the caller's ctypes call has released the interpreter lock: an engine's event
loop runs while a product computes. A worker polls briefly after a job, then sleeps; a second
caller while a job runs computes its own parts one after another.
"""

from __future__ import annotations

import ctypes

import torch

from dsi.kernels.native import library


def _lib() -> ctypes.CDLL | None:
    lib = library("thread_pool")
    if lib is not None and not getattr(lib, "_dsi_typed", False):
        lib.dsi_pool_workers.restype = ctypes.c_int
        lib.dsi_pool_workers.argtypes = []
        lib._dsi_typed = True
    return lib


def run_pointer() -> int | None:
    """The address of ``dsi_pool_run`` (what kernels take as ``run``), None without the library."""
    lib = _lib()
    return None if lib is None else ctypes.cast(lib.dsi_pool_run, ctypes.c_void_p).value


def share(count: int | None = None) -> tuple[int | None, int]:
    """What a kernel call takes as ``run, threads``: the pool's run pointer (None for one thread,
    or without the library) and the thread count (``count`` None: :func:`threads`)."""
    count = threads() if count is None else count
    return (run_pointer() if count > 1 else None), count


def threads() -> int:
    """How many threads a kernel called from this thread shares its work among: torch's count."""
    return torch.get_num_threads()


def workers() -> int:
    """The workers this process has started (0 before the first shared job)."""
    lib = _lib()
    return 0 if lib is None else int(lib.dsi_pool_workers())
