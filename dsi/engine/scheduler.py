"""Scheduler: continuous batching with chunked prefill under a token budget, and preemption.

Each step it walks the running requests first (oldest first), giving each the tokens it is
behind by (``num_tokens + in_flight - num_computed``) up to the remaining budget, then admits
waiting requests while budget, slots and pages last. Counters move at scheduling time, so the
next step can be scheduled while this one still runs (asynchronous scheduling): a decode slice
whose input token is still being sampled carries a placeholder that the runner fills in. A
request with a speculative verify slice in flight (``verifying``) continues at a position known
only once its drafts are verified: it gets a one-token "floating" slice (``Step.floating``) at
the farthest position it can reach, with pages for it, which the worker moves back to where the
verify left off before the forward (``floating``: the rollback counts it).

Preemption by recompute: when a running request needs a page and none is free, the running
request with the longest output gives its pages and slot back and returns to the head of the
queue with ``num_computed = 0``.

A request with a prefix hit (``cached``) gets its cached pages on admission (fresh pages no step
in flight can touch): copied right away, or, with a ``loader``, copied layer by layer beside its
first forward (``Request.hit_load``, waited for by the runner; see dsi.engine.hit_load). It
starts computing at ``replay_start``; an exact hit (``cached.rings``) also gets its producer SWA
rings of [H - 128, H) written into its fresh state slot and starts at H. A preempted hit request is admitted the same way again, so it
keeps the hit semantics. A request that holds an exact hit without the rings to reload (one
imported from another engine) recomputes from position 0 instead: the hit-free run, which is
what the exact hit computes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from dsi.engine.batch import StepSlice
from dsi.engine.hit_load import HitLoad, HitLoader
from dsi.engine.images import slice_embeds
from dsi.engine.request import Request, Status
from dsi.engine.runner import Snapshots
from dsi.kvcache.block_pool import BlockPool, NoFreeBlocks
from dsi.kvcache.state_slots import StateSlots

PLACEHOLDER = -1


@dataclass(slots=True)
class Step:
    slices: list[StepSlice] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    fills: list[bool] = field(default_factory=list)  # slice's first token comes from the previous step
    to_free: list[Request] = field(default_factory=list)  # finished meanwhile; free after this step ran
    blocked: bool = False  # some request needed a page that only a preemption could give
    snapshots: Snapshots = field(default_factory=dict)  # ring snapshots the worker captured
    accepted: dict[int, int] = field(default_factory=dict)  # verify slice index -> drafts accepted
    draft_fills: dict[int, int] = field(default_factory=dict)  # slice index -> drafts the worker fills in
    floating: set[int] = field(default_factory=set)  # slices the worker places (after a verify slice)

    @property
    def num_tokens(self) -> int:
        return sum(len(s.tokens) for s in self.slices)


class Scheduler:
    def __init__(
        self,
        pool: BlockPool,
        slots: StateSlots,
        block_size: int,
        max_batch_tokens: int,
        max_running: int,
        loader: HitLoader | None = None,
    ) -> None:
        self.pool = pool
        self.loader = loader
        self.slots = slots
        self.block_size = block_size
        self.max_batch_tokens = max_batch_tokens
        self.max_running = max_running
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.preemptions = 0

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def schedule(self, allow_preempt: bool = True) -> Step:
        step = Step()
        budget = self.max_batch_tokens
        for req in list(self.running):
            if req.status is not Status.RUNNING or req.floating or self._done_soon(req):
                continue
            if req.verifying:
                if budget > 0 and self._reserve(req, 1, allow_preempt, step):
                    budget -= self._add_floating(step, req)
                continue
            n = min(req.num_tokens + req.in_flight - req.num_computed, budget)
            if n <= 0:
                continue
            if not self._reserve(req, n, allow_preempt, step):
                continue
            budget -= self._add_slice(step, req, n)
        while self.waiting and budget > 0 and len(self.running) < self.max_running and self.slots.num_free:
            req = self.waiting[0]
            start = req.replay_start if req.cached is not None else req.num_computed
            n = min(req.num_tokens - start, budget)
            held = req.num_cached // self.block_size if req.cached is not None else 0
            if max(held, -(-(start + n) // self.block_size)) > self.pool.num_free:
                break
            self.waiting.popleft()
            req.slot = self.slots.allocate()
            req.status = Status.RUNNING
            self.running.append(req)
            if req.cached is not None:
                self._load_cached(req)
            self._reserve(req, n, False, step)
            budget -= self._add_slice(step, req, n)
        return step

    def add_drafts(self, step: Step, index: int, drafts: list[int]) -> bool:
        """Turn decode slice ``index`` of a scheduled step into a verify slice: its drafts follow
        its token and their positions' logits are wanted too. False (nothing changed) when the
        pages they need are not free: drafts never preempt."""
        sl, req = step.slices[index], step.requests[index]
        try:
            req.block_table.extend(self.pool.allocate(self._pages_needed(req, len(drafts))))
        except NoFreeBlocks:
            return False
        sl.tokens.extend(drafts)
        sl.num_logits = 1 + len(drafts)
        req.num_computed += len(drafts)
        req.verifying = True
        return True

    def rollback(self, req: Request, end: int) -> None:
        """Positions >= ``end`` of a verify slice were rejected: compute from ``end`` again, and
        give back the pages that only rejected positions used (the table keeps exactly the pages
        of positions < ``end``, as if the drafts had never been scheduled)."""
        req.num_computed = min(req.num_computed, end + req.floating)  # a floating slice follows end
        req.verifying = req.floating = False
        keep = -(-req.num_computed // self.block_size)
        if len(req.block_table) > keep:
            self.pool.free(req.block_table[keep:])
            del req.block_table[keep:]

    def finish(self, req: Request, reason: str) -> None:
        """Mark finished and leave the running set; the caller frees its cache when safe."""
        req.status = Status.FINISHED
        req.finish_reason = reason
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)

    def free(self, req: Request) -> None:
        if req.hit_load is not None:  # its pages go back to the pool: the copier must be off them
            req.hit_load.cancel()
            req.hit_load = None
        self.pool.free(req.block_table)
        req.block_table = []
        if req.slot >= 0:
            self.slots.free(req.slot)
            req.slot = -1

    # ---- internals -----------------------------------------------------------------------------
    @staticmethod
    def _done_soon(req: Request) -> bool:
        """No more input needed: the tokens in flight already reach max_tokens (or the one
        token of a prefill-only request, whose cache must stay as it is for export)."""
        produced = len(req.output) + req.in_flight
        return produced >= req.params.max_tokens or (req.prefill_only and produced > 0)

    def _add_slice(self, step: Step, req: Request, n: int) -> int:
        start = req.num_computed
        known = req.all_tokens[start : start + n]
        fill = len(known) < n  # the last input token is still being sampled
        tokens = known + [PLACEHOLDER] * (n - len(known))
        sample = start + n == req.num_tokens + req.in_flight
        step.slices.append(
            StepSlice(
                req.slot,
                req.block_table,
                start,
                tokens,
                req.consumer_start,
                sample,
                req.producer_start,
                req.num_cached,
                slice_embeds(req.images, start, start + n) if req.images else [],
                hit_load=self._hit_load(req),
            )
        )
        step.requests.append(req)
        step.fills.append(fill)
        req.num_computed += n
        if sample:
            req.in_flight += 1
        return n

    def _add_floating(self, step: Step, req: Request) -> int:
        """One token after the verify slice in flight: its last emitted token (a placeholder) at
        the position after its last draft, which the worker moves back to where the verify left
        off. The slice gets its own copy of the block table (the rollback shortens the request's
        while the slice may be running; the pages it gives back are past the slice's position)."""
        step.slices.append(
            StepSlice(
                req.slot,
                list(req.block_table),
                req.num_computed,
                [PLACEHOLDER],
                req.consumer_start,
                True,
                req.producer_start,
                req.num_cached,
            )
        )
        step.requests.append(req)
        step.fills.append(True)
        step.floating.add(len(step.slices) - 1)
        req.num_computed += 1
        req.in_flight += 1
        req.floating = True
        return 1

    def _load_cached(self, req: Request) -> None:
        cached = req.cached
        assert cached is not None
        req.block_table = self.pool.allocate(req.num_cached // self.block_size)
        if self.loader is not None:
            req.hit_load = self.loader.start(self.pool.pages, req.block_table, cached.pages)
        else:
            self.pool.pages[torch.tensor(req.block_table, dtype=torch.long)] = cached.pages
        req.num_computed = req.replay_start
        if cached.rings is not None:
            # Even H: the pair (H - 2, H - 1) is closed, so the compressor partial state is empty.
            positions = torch.arange(req.num_cached - cached.rings.shape[2], req.num_cached)
            self.slots.rings[req.slot, : cached.rings.shape[0], :, positions % self.slots.cfg.ring] = (
                cached.rings
            )

    @staticmethod
    def _hit_load(req: Request) -> HitLoad | None:
        """The load a slice of ``req`` must wait for: none once its pages are all in place (a
        failed load stays, so that the forward raises its error)."""
        load = req.hit_load
        if load is not None and load.done and load.error is None:
            req.hit_load = load = None
        return load

    def _pages_needed(self, req: Request, n: int) -> int:
        return max(0, -(-(req.num_computed + n) // self.block_size) - len(req.block_table))

    def _reserve(self, req: Request, n: int, allow_preempt: bool, step: Step) -> bool:
        need = self._pages_needed(req, n)
        while True:
            try:
                req.block_table.extend(self.pool.allocate(need))
                return True
            except NoFreeBlocks:
                if not allow_preempt:
                    step.blocked = True
                    return False
                scheduled = {id(r) for r in step.requests}  # their slices already point at their pages
                victim = max(
                    (r for r in self.running if id(r) not in scheduled),
                    key=lambda r: (len(r.output), r.arrival),
                )
                self._preempt(victim)
                if victim is req:
                    return False

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.free(req)
        req.num_computed = 0
        if req.cached is None:  # nothing to reload (an imported hit): recompute all of it
            req.num_cached = req.replay_start = 0
        req.hashed_pages = 0
        req.status = Status.WAITING
        req.num_preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(req)
