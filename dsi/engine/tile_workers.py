"""Tile workers: the ROW_TILE-row products of one batch-invariant GEMM shared out among threads,
each tile computed by one OpenMP thread.

On its oneDNN path (where dsi's C product kernel, whose threads are
:mod:`dsi.kernels.thread_pool`'s, is not built) a batch-invariant product
(:class:`dsi.engine.gemm.PackedGemm`) is a row of tiles, each one oneDNN call of exactly
``ROW_TILE`` rows. Called one after another from the engine's thread, every
tile is an OpenMP parallel region of its own: a 1,440-row prefill product is 90 regions, and each
region's end is a barrier. Where the host's engines wait passively (``dsi serve``'s roles, see
:mod:`dsi.provision.process`) each barrier puts the threads to sleep and the next region wakes them
(about 80 us a region on a 2-core VM), which made a passive 2-thread engine's invariant prefill
1.25-2x slower than a spinning one.

Here the calling thread and ``threads - 1`` worker threads each take a contiguous run of tiles and
compute them with their OpenMP team cut to one thread (``omp_set_num_threads(1)`` is per thread
in OpenMP): one hand-off per product instead of one barrier per tile, and no spinning::

    tiles [0, t) -> runs r_0 .. r_{n-1} (sizes differ by at most one)
    caller: r_0 with one OpenMP thread      worker i: r_i with one OpenMP thread
    caller waits for every worker -> out

A tile's bits do not change: oneDNN splits a product's columns among its threads, never the
reduction over K, so one thread computes each element as the team does (checked by
``tests/dsi/engine/test_gemm.py`` at one and two threads on the machine it runs on, and by
``tests/dsi/engine/test_tile_workers.py`` against the one-call-per-tile path).

Used only where it helps and can work: libgomp's threads sleep at once at a barrier
(``OMP_WAIT_POLICY=PASSIVE`` without a ``GOMP_SPINCOUNT``, or ``GOMP_SPINCOUNT=0``: what ``dsi
serve`` gives its roles), torch's parallel backend is OpenMP through a libgomp this process has
loaded (Linux wheels), the product has at least two tiles and the caller runs more than one thread.
Where libgomp spins (its default, an engine in a test or ``dsi.llm.LLM``), the caller's idle
OpenMP thread spins on the core a worker needs, and sharing made products slower, not faster.
One product at a time: a second thread that calls while the workers are busy (two engines in one
process) computes its tiles the plain way instead of waiting.

Measured in process (SmolLM2-135M, fp32, 2 threads, passive waits, 4 interleaved rounds): a
prefill of 32 prompts of 45 tokens 3.33 -> 2.21 s; a decode step of 32 rows 125 -> 121 ms.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

Tile = Callable[[int], None]  # computes tile i (rows [i * ROW_TILE, (i + 1) * ROW_TILE)) into its output


def waits_passively(environ: Mapping[str, str]) -> bool:
    """Whether libgomp's threads sleep at once at a barrier under ``environ`` (read when libgomp
    loads, so this process's environment at start)."""
    spin = environ.get("GOMP_SPINCOUNT")
    if spin is not None:
        return spin.strip() == "0"
    return environ.get("OMP_WAIT_POLICY", "").strip().lower() == "passive"


def _libgomp() -> ctypes.CDLL | None:
    """The libgomp torch runs its OpenMP regions on, when torch's backend is OpenMP and this
    process has loaded one (the omp_* calls must reach the runtime oneDNN uses)."""
    if "OpenMP" not in torch.__config__.parallel_info():
        return None
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    paths = sorted({line.split()[-1] for line in maps.splitlines() if "libgomp" in line.split()[-1]})
    if not paths:
        return None
    try:
        lib = ctypes.CDLL(paths[0])
        lib.omp_set_num_threads.argtypes = [ctypes.c_int]
        lib.omp_get_max_threads.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return lib


def _thread_count(gomp: ctypes.CDLL) -> int:
    """The calling thread's OpenMP count once torch has set it: a thread's count is the
    environment's (``OMP_NUM_THREADS``) until torch's first call on that thread sets it to
    torch's own (``torch.set_num_threads``), so a fresh thread (an engine's scheduling thread)
    reads torch's count, not the environment's."""
    torch.get_num_threads()
    return gomp.omp_get_max_threads()


class _Worker:
    """One thread that runs tile runs handed to it, with one OpenMP thread."""

    def __init__(self, gomp: ctypes.CDLL, name: str) -> None:
        self._gomp = gomp
        self._go = threading.Event()
        self.done = threading.Event()
        self._job: tuple[Tile, range, bool, bool] | None = None
        self.error: BaseException | None = None
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def give(self, tile: Tile, run: range, inference: bool, grad: bool) -> None:
        """Run ``tile`` over ``run`` in the caller's inference and grad modes (thread-local)."""
        self._job, self.error = (tile, run, inference, grad), None
        self.done.clear()
        self._go.set()

    def _run(self) -> None:
        # torch sets a thread's OpenMP count to its own on the thread's first parallel op (once
        # per thread): let that happen first, then cut this thread's count to one
        torch.get_num_threads()
        self._gomp.omp_set_num_threads(1)
        while True:
            self._go.wait()
            self._go.clear()
            tile, run, inference, grad = self._job  # type: ignore[misc]
            try:
                with torch.inference_mode(inference), torch.set_grad_enabled(grad):
                    for i in run:
                        tile(i)
            except BaseException as exc:  # handed to the caller
                self.error = exc
            finally:
                self._job = None
                self.done.set()


class TileWorkers:
    """``run(tile, tiles)``: computes every tile, shared out among this thread and workers."""

    def __init__(self, enabled: bool | None = None) -> None:
        """``enabled``: share tiles out (default: where libgomp waits passively, see above)."""
        self.enabled = waits_passively(os.environ) if enabled is None else enabled
        self._gomp = _libgomp()
        self._busy = threading.Lock()
        self._workers: list[_Worker] = []

    @property
    def available(self) -> bool:
        """Whether this process's torch runs OpenMP through a libgomp ``run`` can reach."""
        return self._gomp is not None

    def threads(self) -> int:
        """The calling thread's OpenMP count: how many threads ``run`` shares out among (1 where
        it does not run)."""
        if self._gomp is None or not self.enabled:
            return 1
        return max(1, _thread_count(self._gomp))

    def run(self, tile: Tile, tiles: int) -> bool:
        """True once every tile is computed; False (nothing computed) where the caller should
        compute them itself: not enabled, no libgomp, fewer than two tiles, one thread, or
        workers busy."""
        gomp = self._gomp
        if gomp is None or not self.enabled or tiles < 2:
            return False
        threads = _thread_count(gomp)
        if threads < 2 or not self._busy.acquire(blocking=False):
            return False
        try:
            n = min(threads, tiles)
            while len(self._workers) < n - 1:
                self._workers.append(_Worker(gomp, f"dsi-tile-worker-{len(self._workers)}"))
            bounds = [tiles * k // n for k in range(n + 1)]
            workers = self._workers[: n - 1]
            modes = (torch.is_inference_mode_enabled(), torch.is_grad_enabled())
            for k, worker in enumerate(workers, start=1):
                worker.give(tile, range(bounds[k], bounds[k + 1]), *modes)
            gomp.omp_set_num_threads(1)
            try:
                for i in range(bounds[0], bounds[1]):
                    tile(i)
            finally:
                gomp.omp_set_num_threads(threads)
                for worker in workers:
                    worker.done.wait()
            for worker in workers:
                if worker.error is not None:
                    raise worker.error
            return True
        finally:
            self._busy.release()


_shared: TileWorkers | None = None
_shared_lock = threading.Lock()


def tile_workers() -> TileWorkers:
    """This process's tile workers (made on first use; a forked child makes its own)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = TileWorkers()
        return _shared


def _forget_in_child() -> None:
    global _shared, _shared_lock
    _shared, _shared_lock = None, threading.Lock()  # the parent's worker threads are not here


os.register_at_fork(after_in_child=_forget_in_child)
