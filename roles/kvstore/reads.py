"""ReadPool: block reads on worker threads, into host shared memory or fresh buffers.

    GetBlocks -> ReadPlan (event loop) -> jobs: runs of up to 16 blocks stored back to back
              -> threads: one preadv per run + checksums -> statuses -> read_finish (event loop)

File reads and xxh3 release the GIL for the bytes they move, so a few threads keep a disk busy
while the event loop goes on serving. At most ``max_inflight`` blocks are being read at once,
across all calls; a call beyond that waits for room. A run is one large read (the headers
between its payloads land in scratch memory), so a prefix stored in order costs few syscalls.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from dsi.kvcache.shm import HostBuffer
from dsi.kvcache.store import MISSING, BlockStore, ReadPlan

_JOB_BLOCKS = 16


class ReadPool:
    def __init__(self, workers: int, max_inflight: int) -> None:
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="kvstore-read")
        self._room = asyncio.Semaphore(max(1, max_inflight // _JOB_BLOCKS))  # jobs
        self.max_inflight = max_inflight
        self.in_flight = 0  # blocks

    async def read(self, plan: ReadPlan, dests: list[memoryview | None]) -> list[int]:
        """Fill ``dests[i]`` with block i (None = not wanted); returns one status per block."""
        status = [MISSING] * len(dests)
        wanted = [i for i, d in enumerate(dests) if d is not None]
        jobs = BlockStore.runs(plan, wanted, _JOB_BLOCKS)
        await asyncio.gather(*(self._job(plan, idx, dests, status) for idx in jobs))
        return status

    async def _job(self, plan: ReadPlan, idx: list[int], dests: list, status: list[int]) -> None:
        await self._room.acquire()
        self.in_flight += len(idx)
        try:
            loop = asyncio.get_running_loop()
            codes = await loop.run_in_executor(self._pool, _read_many, plan, idx, dests)
            for i, code in zip(idx, codes, strict=True):
                status[i] = code
        finally:
            self.in_flight -= len(idx)
            self._room.release()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def _read_many(plan: ReadPlan, idx: list[int], dests: list) -> list[int]:
    return BlockStore.read_run(plan, idx, [dests[i] for i in idx])


def shm_dests(buf: HostBuffer, plan: ReadPlan, offset: int, stride: int) -> list[memoryview | None]:
    """Block i of the plan -> its slot ``[offset + i * stride, + size)`` of ``buf``."""
    n = len(plan.slots)
    if stride <= 0 or offset < 0 or offset + n * stride > buf.nbytes:
        raise ValueError(f"{n} blocks of stride {stride} at offset {offset} do not fit {buf.nbytes} B of shm")
    sizes = plan.where.size.tolist()
    dests: list[memoryview | None] = []
    for i, slot in enumerate(plan.slots.tolist()):
        if slot < 0:
            dests.append(None)
        elif sizes[i] > stride:
            raise ValueError(f"block {i} has {sizes[i]} B, more than the stride of {stride} B")
        else:
            start = offset + i * stride
            dests.append(buf.view[start : start + sizes[i]])
    return dests
