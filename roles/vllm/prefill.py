"""VllmPrefillActor: a prefill instance whose engine is vLLM.

``PrefillTo`` (from the decode that holds the lease):

    1. hash the prompt's full blocks (all but its last token) on this instance's chain (salted
       with its fingerprint: pages are portable only between equal ones) and fetch the leading
       run the kvstore holds; stage it (a store that is down or slow is a miss, never an error);
    2. vLLM runs the prompt for one token with dsi's connector told to load the staged hit
       (vLLM computes only the rest) and to stage all the prompt's blocks when it completes
       (``hit_params``); the connector writes them, every layer, within that engine step, so the
       file is complete when the first token comes back;
    3. write the file into the decode's lease over the data plane and answer ``Prefilled``; queue
       the prompt's full blocks past the hit for the kvstore, so that any prefill can hit them.

Staged files are removed whatever happens. A request whose first token already ends it (EOS, a
stop token, ``max_tokens`` 1) is answered with ``finish`` and nothing is sent.

Drain (``DrainOrder``): the gateway sends a draining prefill no new work; after the grace period,
once its calls in flight are answered, the role retires.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import mmap
import secrets
import time
from pathlib import Path

import msgspec
import numpy as np

from dsi.actor import handles
from dsi.engine.hit_policy import NO_HIT
from dsi.errors import DsiError, InvalidRequest, TransferFailed
from dsi.kvcache.hashchain import unpack
from dsi.messages.gateway import Generate
from dsi.messages.handoff import KvLease, Prefilled, PrefillTo
from dsi.messages.migrate import DrainOrder
from dsi.roles.controller.lifecycle import IllegalTransition
from dsi.roles.engine_role import Arrival, lease_target
from dsi.roles.vllm.role import VllmRole, VllmRoleSettings
from dsi.vllm.wiring import hit_params

log = logging.getLogger(__name__)


class VllmPrefillActor(VllmRole):
    kind = "prefill"

    def __init__(self, name: str, settings: VllmRoleSettings) -> None:
        super().__init__(name, settings)
        self._in_flight = 0
        self._drain: asyncio.Task | None = None
        self._drain_ends = 0.0

    def requests_here(self) -> int:
        return self._in_flight

    @handles
    async def drain_order(self, msg: DrainOrder) -> None:
        loop = asyncio.get_running_loop()
        if msg.cancel:
            if self._drain is not None and loop.time() >= self._drain_ends:
                raise IllegalTransition(f"{self.name}: the grace period is over")
            if self._drain is not None:
                self._drain.cancel()
            self._drain = None
        elif self._drain is None:
            self._drain_ends = loop.time() + msg.grace_s
            self._drain = loop.create_task(self._finish_then_retire(msg.grace_s))

    async def _finish_then_retire(self, grace_s: float) -> None:
        await asyncio.sleep(grace_s)
        while self._in_flight:
            await asyncio.sleep(0.05)
        self.retire("drained")

    @handles(concurrent=True)
    async def prefill_to(self, msg: PrefillTo) -> Prefilled:
        req = msg.request
        if not req.token_ids:
            raise InvalidRequest("the prompt is empty")
        if req.images:
            raise InvalidRequest("vLLM-backed instances of dsi serve text prompts only")
        arrival = self.arrive(len(req.token_ids))
        self._in_flight += 1
        staged, hit = self.staged(msg.lease.lease_id), self.staged(f"{msg.lease.lease_id}.hit")
        try:
            return await self._prefill_to(msg, arrival, staged, hit)
        finally:
            self._in_flight -= 1
            arrival.settle()
            staged.unlink(missing_ok=True)
            hit.unlink(missing_ok=True)

    async def _prefill_to(self, msg: PrefillTo, arrival: Arrival, staged: Path, hit: Path) -> Prefilled:
        assert self.service is not None and self.data is not None and self.layout is not None
        req, lease = msg.request, msg.lease
        started = time.monotonic()
        hashes = self._hashes(req)
        hit_blocks = await self._fetch_hit(hashes, hit)
        one = msgspec.structs.replace(req.sampling, max_tokens=1)
        vid = f"{lease.lease_id}.{secrets.token_hex(3)}"
        params = hit_params(staged, hit, hit_blocks * self.layout.block_size, hit_blocks)
        stream = self.service.generate(vid, list(req.token_ids), one, params)
        async with contextlib.aclosing(stream):
            outputs = [o async for o in stream]
        arrival.settle()
        self._persist(staged, hashes, hit_blocks, req.traffic_class)
        self.counters.prefills += 1
        last = outputs[-1]
        tokens = [t for o in outputs for t in o.new_tokens]
        logprobs = [p for o in outputs for p in o.logprobs]
        tops = [t for o in outputs for t in o.top_logprobs]
        cached = max(o.cached_tokens for o in outputs)
        ended = "stop" if last.finish_reason == "stop" else "length" if req.sampling.max_tokens <= 1 else ""
        if ended:  # the first token already ended it: nothing to hand off
            return Prefilled(lease.lease_id, tokens, logprobs, 0, 0, 0, cached_tokens=cached,
                             finish=ended, top_logprobs=tops, hit=NO_HIT)  # fmt: skip
        remaining = max(0.5, lease.expires_in_s - (time.monotonic() - started))
        try:
            await self._send(staged, lease, remaining)
        except DsiError:
            self.counters.failed_handoffs += 1
            raise
        self.counters.handoffs += 1
        return Prefilled(lease.lease_id, tokens, logprobs, 0, 0, len(req.token_ids), cached_tokens=cached,
                         top_logprobs=tops, hit=NO_HIT)  # fmt: skip

    def _hashes(self, req: Generate) -> list[bytes]:
        """Chain hashes of the prompt's full blocks before its last token (which is always computed)."""
        assert self.chain is not None
        bs = self.chain.block_size
        full = (len(req.token_ids) - 1) // bs
        try:
            packed = self.chain.hashes(req.token_ids[: full * bs], cache_salt=req.sampling.cache_salt)
        except (ValueError, OverflowError) as exc:
            raise InvalidRequest(f"prompt token ids: {exc}") from None
        return unpack(packed)

    async def _fetch_hit(self, hashes: list[bytes], path: Path) -> int:
        """The leading blocks the kvstore holds, staged into ``path``; how many."""
        if self.kvstore is None or not hashes or self.layout is None:
            return 0
        fetched = await self.kvstore.fetch(hashes, self.layout.block_bytes)
        try:
            found = len(fetched)
            if found:
                await asyncio.get_running_loop().run_in_executor(
                    None, fetched.blocks[:found].tofile, str(path)
                )
        finally:
            fetched.release()
        self.counters.store_hit_blocks += found
        return found

    def _persist(self, staged: Path, hashes: list[bytes], hit_blocks: int, traffic_class: str) -> None:
        """Queue the staged full blocks past the hit for the kvstore (the mapping outlives the file)."""
        if self.kvstore is None or len(hashes) <= hit_blocks or self.layout is None or not staged.exists():
            return
        total = staged.stat().st_size // self.layout.block_bytes
        mapped = np.memmap(staged, dtype=np.uint8, mode="r", shape=(total, self.layout.block_bytes))
        blocks = np.asarray(mapped)  # a plain view of the mapping (the store client wants ndarrays)
        new = range(hit_blocks, min(len(hashes), total))
        if self.kvstore.put_background([hashes[i] for i in new], [blocks[i] for i in new], traffic_class):
            self.counters.persisted_blocks += len(new)

    async def _send(self, staged: Path, lease: KvLease, timeout_s: float) -> None:
        """The staged blocks into the decode's lease (the file is exactly the lease's size)."""
        assert self.data is not None
        try:
            with staged.open("rb") as f:
                size = staged.stat().st_size
                if size != lease.nbytes:
                    raise TransferFailed(
                        f"{self.name}: staged {size} bytes of KV for a lease of {lease.nbytes} "
                        "(do the two instances serve the same model, dtype and block size?)"
                    )
                with mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as mapped:
                    view = memoryview(mapped)
                    try:
                        await self.data.send(lease_target(lease), [view], timeout_s=timeout_s)
                    finally:
                        view.release()
        except FileNotFoundError:
            raise TransferFailed(f"{self.name}: vLLM's connector staged no KV for {lease.lease_id}") from None
