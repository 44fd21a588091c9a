"""PrefillActor: prompt forward for the un-cached tokens, then the KV handoff to a decode.

``PrefillTo`` (from the decode that holds the lease):

    1. hash the prompt's full blocks; fetch the leading hits from the kvstore into shared memory
       (a kvstore that is down or slow is a miss, never an error);
    2. prefill only what the hit does not cover, plus the SWA replay window (engine semantics,
       see dsi.model.reference); the engine stops after the first token and keeps the cache;
    3. export the request's pages + state and write them into the decode's lease over the data
       plane; answer ``Prefilled`` once the decode has every byte.

The exported copy lives only for the send: whether it completes, fails or the decode vanished,
nothing stays behind here. A request whose first token already ends it is not sent at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import torch

from dsi.actor import handles
from dsi.engine import CachedPrefix
from dsi.errors import DsiError, InvalidRequest
from dsi.kvcache.hashchain import HASH_BYTES
from dsi.messages.gateway import Generate
from dsi.messages.handoff import Prefilled, PrefillTo
from dsi.roles.engine_role import EngineRole, EngineRoleSettings, sampling_params
from dsi.roles.kvstore.client import FetchedBlocks, KvstoreClient
from dsi.transport.kv import KvTarget

log = logging.getLogger(__name__)


class PrefillActor(EngineRole):
    def __init__(self, name: str, settings: EngineRoleSettings) -> None:
        super().__init__(name, settings)
        self.kvstore: KvstoreClient | None = None

    async def on_start(self) -> None:
        await super().on_start()
        if self.settings.controller:
            assert self.ctx is not None
            self.kvstore = KvstoreClient(self.settings.controller, self.ctx, keys=self.settings.keys,
                                         peer_id=self.name)
            await self.kvstore.start()

    async def on_stop(self) -> None:
        if self.kvstore is not None:
            await self.kvstore.close()
        await super().on_stop()

    @handles(concurrent=True)
    async def prefill_to(self, msg: PrefillTo) -> Prefilled:
        assert self.service is not None and self.data is not None
        req, lease = msg.request, msg.lease
        started = time.monotonic()
        fetched = await self._fetch_hits(req)
        rid = lease.lease_id  # unique per attempt, even when the entrypoint retries the same request
        try:
            cached = None
            if fetched is not None and len(fetched):
                pages = fetched.torch().view(torch.float32).reshape(len(fetched), self.engine.page_elems)
                cached = CachedPrefix(len(fetched) * self.engine.cfg.block_size, pages)
            stream = self.service.generate(rid, list(req.token_ids), sampling_params(req.sampling),
                                           prefill_only=True, cached=cached)
            async with contextlib.aclosing(stream):
                outputs = [o async for o in stream]
        finally:
            if fetched is not None:
                fetched.release()
        last = outputs[-1]
        self.counters.prefills += 1
        stats = self.engine.stats.last_request(rid)
        replay = stats.replay_tokens if stats is not None else 0
        if last.finish_reason != "prefilled":  # the first token already ended it: nothing to hand off
            return Prefilled(lease.lease_id, list(last.output), list(last.logprobs or []), 0, 0, 0,
                             cached_tokens=cached.num_tokens if cached is not None else 0, replay_tokens=replay,
                             finish=last.finish_reason or "stop")
        # Shielded: a caller that goes away now must not leave the prefilled request (and its
        # pages) behind in the engine; the exported copy is dropped with this task.
        state = await asyncio.shield(self.service.export(rid))
        target = KvTarget(lease.backend, lease.address, lease.lease_id, lease.nbytes, lease.region)
        remaining = max(0.5, lease.expires_in_s - (time.monotonic() - started))
        try:
            await self.data.send(target, state.to_parts(), timeout_s=remaining)
        except DsiError:
            self.counters.failed_handoffs += 1
            raise
        self.counters.handoffs += 1
        return Prefilled(lease.lease_id, list(state.output), list(state.logprobs), state.seed, state.consumer_start,
                         state.num_computed, cached_tokens=state.num_cached, replay_tokens=replay,
                         replay_start=state.replay_start)

    async def _fetch_hits(self, req: Generate) -> FetchedBlocks | None:
        """The leading cached blocks of the prompt (at least its last token is always computed)."""
        if self.kvstore is None:
            return None
        bs = self.engine.cfg.block_size
        usable = (len(req.token_ids) - 1) // bs
        if usable <= 0:
            return None
        try:
            packed = self.engine.hash_chain.hashes(req.token_ids[: usable * bs], cache_salt=req.cache_salt)
        except (ValueError, OverflowError) as exc:
            raise InvalidRequest(f"prompt token ids: {exc}") from None
        hashes = [packed[i:i + HASH_BYTES] for i in range(0, len(packed), HASH_BYTES)]
        return await self.kvstore.fetch(hashes, self.engine.page_bytes)
