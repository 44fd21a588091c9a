"""Ring snapshots: the producer SWA state of each request at its last block boundary.

    worker: forward(step) --captures--> step.snapshots
    CPU, in step order: commit --> req.ring_snapshot = (B, rings)   (not for a request already
                                   finished: async scheduling runs one discarded extra slice)
    finish (not abort) / export --> queue RingSnapshot --take--> the host keeps it for exact hits

Committing on the CPU in step order makes the snapshot of a finished request the same with
synchronous and asynchronous scheduling: the last boundary reached by the positions its output
needed.
"""

from __future__ import annotations

from collections import deque

from dsi.engine.prefix import RingSnapshot
from dsi.engine.request import Request
from dsi.engine.runner import Snapshots
from dsi.kvcache.hashchain import HASH_BYTES, HashChain


class RingSnapshots:
    def __init__(self, chain: HashChain, block_size: int, collect: bool) -> None:
        self.chain = chain
        self.block_size = block_size
        self.collect = collect
        self._queue: deque[RingSnapshot] = deque()  # appended by the engine, drained by any thread

    def commit(self, requests: list[Request], captured: Snapshots) -> None:
        """A step's captures (slice index -> (B, rings)) into the requests that are still running."""
        for j, (boundary, rings) in captured.items():
            req = requests[j]
            if req.finished:
                continue
            if req.ring_snapshot is None or boundary >= req.ring_snapshot[0]:
                req.ring_snapshot = (boundary, rings)

    def queue(self, req: Request) -> bool:
        """Queue a copy of the request's snapshot (once); False when there is none to queue."""
        if not self.collect or req.ring_snapshot is None:
            return False
        boundary, rings = req.ring_snapshot
        req.ring_snapshot = None
        self._queue.append(
            RingSnapshot(req.request_id, boundary, self._block_hash(req, boundary), rings.clone())
        )
        return True

    def take(self) -> list[RingSnapshot]:
        """Drain the queued snapshots (safe from another thread while the engine steps)."""
        return [self._queue.popleft() for _ in range(len(self._queue))]

    def __len__(self) -> int:
        return len(self._queue)

    def _block_hash(self, req: Request, boundary: int) -> bytes:
        """The chain hash of the block ending at ``boundary`` (as FullPage has it)."""
        n = boundary // self.block_size
        if len(req.block_hashes) >= n:
            return req.block_hashes[n - 1]
        return self.chain.hashes(
            req.all_tokens[:boundary], cache_salt=req.params.cache_salt, extras=req.block_extras or None
        )[-HASH_BYTES:]
