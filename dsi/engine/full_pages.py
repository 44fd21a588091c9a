"""Chain hashes of a request's pages as they fill, and copies of full pages for persistence.

A page is full once all 128 of its positions are computed; from then on no step writes it
(later positions live in later pages, and a pair of ratio-2 latents never straddles a page).
Its hash is ``HashChain.hashes`` over the request's tokens (prompt, then output) with the
request's cache salt, so another process hashing the same prompt (and salt) finds it. Hashes are kept across a preemption (the tokens do
not change); the pool registration is redone for the new pages.
"""

from __future__ import annotations

from collections import deque

from dsi.engine.prefix import FullPage
from dsi.engine.request import Request
from dsi.kvcache.block_pool import BlockPool
from dsi.kvcache.hashchain import HashChain, unpack


class FullPages:
    def __init__(self, chain: HashChain, pool: BlockPool, block_size: int, collect: bool) -> None:
        self.chain = chain
        self.pool = pool
        self.block_size = block_size
        self.collect = collect
        self._queue: deque[FullPage] = deque()  # appended by the engine, drained by any thread

    def update(self, req: Request, computed: int) -> None:
        """Positions [0, computed) of ``req`` are final in its pages: hash (and copy) full pages."""
        size = self.block_size
        full = computed // size
        known = len(req.block_hashes)
        if full > known:
            parent = req.block_hashes[-1] if known else self.chain.root(req.params.cache_salt)
            extras = {i - known: e for i, e in req.block_extras.items() if known <= i < full}
            packed = self.chain.hashes(
                req.all_tokens[known * size : full * size], parent=parent, extras=extras or None
            )
            req.block_hashes += unpack(packed)
        n = min(full, len(req.block_table))
        for page in range(req.hashed_pages, n):
            self.pool.set_hash(req.block_table[page], req.block_hashes[page])
        req.hashed_pages = max(req.hashed_pages, n)
        if self.collect:
            for page in range(req.collected_pages, n):
                data = self.pool.pages[req.block_table[page]].clone()
                self._queue.append(FullPage(req.request_id, page, req.block_hashes[page], data))
            req.collected_pages = max(req.collected_pages, n)

    def take(self) -> list[FullPage]:
        """Drain the queued pages (safe from another thread while the engine steps)."""
        return [self._queue.popleft() for _ in range(len(self._queue))]

    def __len__(self) -> int:
        return len(self._queue)
