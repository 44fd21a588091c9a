"""VllmPrefillActor: a prefill instance whose engine is vLLM.

``PrefillTo`` (from the decode that holds the lease):

    1. hash the prompt's full blocks (all but its last token) on this instance's chain (salted
       with its fingerprint: pages are portable only between equal ones) and fetch the leading
       run the kvstore holds past those vLLM's own prefix cache holds (its KV events say which);
       stage it (a store that is down or slow is a miss, never an error);
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

import contextlib
import logging
import mmap
import secrets
import time
from pathlib import Path

import msgspec

from dsi.actor import handles
from dsi.engine.hit_policy import NO_HIT
from dsi.errors import DsiError, InvalidRequest, TransferFailed
from dsi.messages.handoff import KvLease, Prefilled, PrefillTo
from dsi.messages.migrate import DrainOrder
from dsi.roles.engine_role import Arrival, lease_target
from dsi.roles.prefill_drain import PrefillDrain
from dsi.roles.vllm.role import VllmRole, VllmRoleSettings
from dsi.vllm.wiring import hit_params

log = logging.getLogger(__name__)


class VllmPrefillActor(VllmRole):
    kind = "prefill"

    def __init__(self, name: str, settings: VllmRoleSettings) -> None:
        super().__init__(name, settings)
        self.drain = PrefillDrain(name, self.retire)  # counts the PrefillTo calls running

    def requests_here(self) -> int:
        return self.drain.in_flight

    @handles
    async def drain_order(self, msg: DrainOrder) -> None:
        """Drain: no new work from the gateway; retire once the grace period is over and the
        work in flight is done (see dsi.roles.prefill_drain)."""
        self.drain.order(msg)

    @handles(concurrent=True)
    async def prefill_to(self, msg: PrefillTo) -> Prefilled:
        req = msg.request
        if not req.token_ids:
            raise InvalidRequest("the prompt is empty")
        if req.images:
            raise InvalidRequest("vLLM-backed instances of dsi serve text prompts only")
        arrival = self.arrive(len(req.token_ids))
        self.drain.in_flight += 1
        staged, hit = self.staged(msg.lease.lease_id), self.staged(f"{msg.lease.lease_id}.hit")
        try:
            return await self._prefill_to(msg, arrival, staged, hit)
        finally:
            self.drain.in_flight -= 1
            arrival.settle()
            staged.unlink(missing_ok=True)
            hit.unlink(missing_ok=True)

    async def _prefill_to(self, msg: PrefillTo, arrival: Arrival, staged: Path, hit: Path) -> Prefilled:
        assert self.service is not None and self.data is not None and self.layout is not None
        req, lease = msg.request, msg.lease
        started = time.monotonic()
        hashes = self.prompt_hashes(req)
        local = self.held_locally(hashes)
        found = await self.fetch_hit(hashes, hit, skip=local)
        one = msgspec.structs.replace(req.sampling, max_tokens=1)
        vid = f"{lease.lease_id}.{secrets.token_hex(3)}"
        # the decode needs every block: the whole prompt is staged, whatever was hit
        params = hit_params(staged, hit, (local + found) * self.layout.block_size, found, first=local)
        stream = self.service.generate(vid, list(req.token_ids), one, params)
        async with contextlib.aclosing(stream):
            outputs = [o async for o in stream]
        arrival.settle()
        self.persist(staged, hashes, local + found, req.traffic_class)
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
