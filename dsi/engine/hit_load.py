"""Layer-wise loading of prefix-hit pages: the forward starts while later layers' parts are copied.

A V4 page holds one part per KV-owning layer (:mod:`dsi.kvcache.layout`), and the forward
first reads each part at a known layer::

    page  = [ source 0 latents ][ source 1 latents ] ... [ global latents ]
    read by   layer kv_sources[0]  layer kv_sources[1]     the first consumer layer (n_producer)

On admission of a hit the scheduler starts a :class:`HitLoad` instead of copying the pages;
the copier copies part after part of every page, in the order the layers need them, and sets
one event per part. The forward waits, before layer ``l``, for the parts that layers ``<= l``
read (``HitLoad.wait``)::

    copier:   [source 0][source 1][global .....]
    forward:  layer 0 | wait(1) layer 1 | layer 2 | wait(3) layer 3 | wait(4) layer 4 ... 7

The bytes are those of a copy before the forward, so the step's output is the same bits; only
the time the forward waits changes. Tiny (``page_elems`` 16,384 fp32): parts of 64, 64 and
128 KiB per page, needed at layers 1, 3 and 4.

Where the copies run: on the CPU, one host thread copies with numpy (single-threaded, the GIL
released while bytes move), so it takes one core's share and starts no OpenMP team beside the
forward's intra-op threads; on CUDA the same thread queues host-to-device copies on a side
stream (:func:`dsi.engine.device.copy_stream`) and the compute stream waits on a CUDA event per
part (the host waits only until the copy is queued).

Lifetime: a load reads its source (often a view of the kvstore's shared memory) until its last
part is copied; ``cancel`` stops it between parts and returns once the copier no longer
touches either side, so the pages may go back to the pool and the source to its owner.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dsi.engine.device import CopyStream, copy_stream
from dsi.kvcache.layout import BlockLayout
from dsi.model.config import ModelConfig

Runs = list[tuple[int, int, int]]  # (first pool page, first source page, pages) of consecutive ids
CopyPart = Callable[[torch.Tensor, torch.Tensor, Runs, int, int], None]


@dataclass(slots=True, frozen=True)
class PagePart:
    """Columns ``[start, stop)`` (fp32 elements) of every page, first read by layer ``layer``."""

    layer: int
    start: int
    stop: int


def page_parts(cfg: ModelConfig) -> tuple[PagePart, ...]:
    """The parts of a V4 page in the order the forward first reads them (layers increasing)."""
    layout = BlockLayout(cfg)
    parts = [
        PagePart(layer, layout.source_offset(k), layout.source_offset(k + 1))
        for k, layer in enumerate(cfg.kv_sources)
    ]
    parts.append(PagePart(cfg.n_producer, layout.global_offset, layout.elems))
    return tuple(parts)


def page_runs(blocks: list[int]) -> Runs:
    """Runs of consecutive pool pages: one copy each instead of one per page."""
    runs: Runs = []
    for i, block in enumerate(blocks):
        if runs and runs[-1][0] + runs[-1][2] == block:
            first, src, n = runs[-1]
            runs[-1] = (first, src, n + 1)
        else:
            runs.append((block, i, 1))
    return runs


def copy_part(dst: torch.Tensor, src: torch.Tensor, runs: Runs, start: int, stop: int) -> None:
    """``dst[pages of runs, start:stop] = src[rows, start:stop]``: numpy on the CPU (one thread,
    GIL released), a torch copy elsewhere (on the current stream, asynchronous from host memory)."""
    if dst.device.type == "cpu" and src.device.type == "cpu":
        import numpy as np

        d, s = dst.numpy(), src.numpy()
        for first, row, n in runs:
            np.copyto(d[first : first + n, start:stop], s[row : row + n, start:stop])
        return
    for first, row, n in runs:
        dst[first : first + n, start:stop].copy_(src[row : row + n, start:stop], non_blocking=True)


class HitLoad:
    """One hit's pages on their way from ``src`` ``[n, page_elems]`` into pool pages ``blocks``.

    ``copy_s``: seconds the copier spent on it; ``stall_s``: seconds the forward waited for it.
    """

    def __init__(
        self,
        parts: tuple[PagePart, ...],
        dst: torch.Tensor,
        blocks: list[int],
        src: torch.Tensor,
        fence: CopyStream | None = None,
    ) -> None:
        self.parts = parts
        self.dst, self.src, self.fence = dst, src, fence
        self.runs = page_runs(blocks)
        self.copy_s = self.stall_s = 0.0
        self.error: BaseException | None = None
        self._copied = [threading.Event() for _ in parts]
        self._device_events: list[Any] = [None] * len(parts)
        self._next = 0  # the part the copier copies next (copier-owned)
        self._cancelled = False

    @property
    def done(self) -> bool:
        """Every part copied (or the load was cancelled or failed)."""
        return self._copied[-1].is_set()

    def wait(self, layer: int) -> None:
        """Block until the parts that layers ``<= layer`` read are copied (on CUDA: queued, and
        the compute stream waits for them). Raises the copier's error, if it had one."""
        for k, part in enumerate(self.parts):
            if part.layer > layer:
                break
            event = self._copied[k]
            if not event.is_set():
                t0 = time.perf_counter()
                event.wait()
                self.stall_s += time.perf_counter() - t0
            if self.error is not None:
                raise RuntimeError("loading the pages of a prefix hit failed") from self.error
            if self.fence is not None and self._device_events[k] is not None:
                self.fence.wait(self._device_events[k])
                self._device_events[k] = None  # waited once: later waits are no-ops

    def wait_all(self) -> None:
        """Block until every part is copied (what reads pages outside the forward calls)."""
        self.wait(self.parts[-1].layer)

    def cancel(self) -> None:
        """Stop between parts; returns once the copier (and a side stream's queued copies) no
        longer touch this load's memory, so its pages may be reused and its source released."""
        self._cancelled = True
        self._copied[-1].wait()
        for event in self._device_events:
            if event is not None:
                event.synchronize()


class HitLoader:
    """The copier: one thread that copies the parts of every started load, always the part that
    the earliest layer needs next (ties: the load started first)."""

    def __init__(self, cfg: ModelConfig, device: torch.device, copy: CopyPart = copy_part) -> None:
        self.parts = page_parts(cfg)
        self.copy = copy  # replaceable: tests inject a slow or failing copier
        self.fence = copy_stream(device)
        self._loads: list[HitLoad] = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def start(self, dst: torch.Tensor, blocks: list[int], src: torch.Tensor) -> HitLoad:
        """Begin copying ``src`` ``[len(blocks), page_elems]`` into pool pages ``blocks`` of ``dst``."""
        load = HitLoad(self.parts, dst, list(blocks), src, self.fence)
        with self._cond:
            if self._closed:
                raise RuntimeError("the hit loader is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="dsi-hit-load", daemon=True)
                self._thread.start()
            self._loads.append(load)
            self._cond.notify()
        return load

    def close(self) -> None:
        """Cancel what is left and stop the thread."""
        with self._cond:
            self._closed = True
            for load in self._loads:
                load._cancelled = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._loads and not self._closed:
                    self._cond.wait()
                if not self._loads:
                    return
                load = min(self._loads, key=lambda x: self.parts[x._next].layer)  # first of equals
            k = load._next
            if not load._cancelled and load.error is None:
                self._copy_one(load, k)
            load._next += 1
            if load._next == len(self.parts) or load._cancelled or load.error is not None:
                with self._cond:
                    self._loads.remove(load)
                for event in load._copied[k:]:
                    event.set()
            else:
                load._copied[k].set()

    def _copy_one(self, load: HitLoad, k: int) -> None:
        part = self.parts[k]
        t0 = time.perf_counter()
        try:
            if self.fence is None:
                self.copy(load.dst, load.src, load.runs, part.start, part.stop)
            else:
                load._device_events[k] = self.fence.run(
                    lambda: self.copy(load.dst, load.src, load.runs, part.start, part.stop)
                )
        except Exception as exc:  # the forward that waits for it raises it
            load.error = exc
        load.copy_s += time.perf_counter() - t0
