"""PrefillActor: prompt forward for the un-cached tokens, then the KV handoff to a decode.

``PrefillStream`` (from the decode that holds the lease; ``PrefillTo`` is the same answered once):

    1. hash the prompt's full blocks; fetch the leading hits from the kvstore into shared memory
       (a kvstore that is down or slow is a miss, never an error);
    2. if the engine instance that computed the hit's last boundary still holds its SWA state
       (the kvstore knows who announced it), pull it over the data plane: the hit is then exact
       and nothing is replayed. Otherwise the request's hit policy decides
       (dsi.engine.hit_policy): ``bounded`` replays the SWA window before the boundary (bounded
       replay, the semantics of dsi.model.reference with ``hit``), ``exact`` takes no hit.
       Prefill only what the hit does not cover; the engine stops after the first token and
       keeps the cache. A re-run pinned to the hit its first run took (``Generate.pin_hit``)
       fetches exactly that hit's pages and takes what ``pinned_hit`` says, or fails with
       ``HitUnavailable``;
    3. send ``FirstToken`` at once (the client has its first token while the handoff runs);
    4. export the request's pages + state and write them into the decode's lease over the data
       plane; answer ``Prefilled`` once the decode has every byte.

The export is not a copy: the request's pages stay held in the engine's pool while the send
reads them, and go back when it ends. Whether it completes, fails or the decode vanished (before
or after its first token), nothing stays behind here. A request whose first token already
ends it is not sent at all.

Drain (``DrainOrder``): the gateway sends a draining prefill no new work; after the grace
period, once its calls in flight are answered, the role retires.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

import torch

from dsi.actor import handles
from dsi.engine import CachedPrefix
from dsi.engine.hit_policy import (
    NO_HIT,
    HitChoice,
    HitPolicy,
    choose_hit,
    exact_boundary,
    fetch_limit,
    pinned_hit,
)
from dsi.errors import DsiError, InvalidRequest
from dsi.kvcache.hashchain import image_extras, unpack
from dsi.messages.gateway import Generate
from dsi.messages.handoff import (
    FirstToken,
    HitUnavailable,
    KvLease,
    Prefilled,
    PrefillStream,
    PrefillTo,
    PullState,
    StatePulled,
)
from dsi.messages.migrate import DrainOrder
from dsi.roles.engine_role import Arrival, EngineRole, EngineRoleSettings, lease_target
from dsi.roles.kvstore.client import FetchedBlocks
from dsi.roles.prefill_drain import PrefillDrain
from dsi.transport.kv.ids import transfer_id

log = logging.getLogger(__name__)


class PrefillActor(EngineRole):
    kind = "prefill"
    state_pull_timeout_s = 2.0

    def __init__(self, name: str, settings: EngineRoleSettings) -> None:
        super().__init__(name, settings)
        self.drain = PrefillDrain(name, self.retire)  # counts the PrefillTo calls running

    @handles
    async def drain_order(self, msg: DrainOrder) -> None:
        """Drain: no new work from the gateway; retire once the grace period is over and the
        work in flight is done (see dsi.roles.prefill_drain)."""
        self.drain.order(msg)

    @handles(concurrent=True)
    async def prefill_to(self, msg: PrefillTo) -> Prefilled:
        async with contextlib.aclosing(self._prefill_items(msg.request, msg.lease, first=False)) as items:
            async for item in items:
                if isinstance(item, Prefilled):
                    return item
        raise AssertionError("a prefill ends with Prefilled")

    @handles
    async def prefill_stream(self, msg: PrefillStream) -> AsyncIterator[FirstToken | Prefilled]:
        async with contextlib.aclosing(self._prefill_items(msg.request, msg.lease, first=True)) as items:
            async for item in items:
                yield item

    async def _prefill_items(
        self, req: Generate, lease: KvLease, first: bool
    ) -> AsyncIterator[FirstToken | Prefilled]:
        """``FirstToken`` (with ``first``, unless the first token ends the request), then ``Prefilled``."""
        arrival = self.arrive(max(1, len(req.token_ids) - req.cached_tokens))  # queued until computed
        self.drain.in_flight += 1
        try:
            async with contextlib.aclosing(self._prefill_to(req, lease, arrival, first)) as items:
                async for item in items:
                    yield item
        finally:
            self.drain.in_flight -= 1
            arrival.settle()

    async def _prefill_to(
        self, req: Generate, lease: KvLease, arrival: Arrival, first: bool
    ) -> AsyncIterator[FirstToken | Prefilled]:
        assert self.service is not None and self.data is not None
        started = time.monotonic()
        rid = lease.lease_id  # unique per attempt, even when the entrypoint retries the same request
        policy = req.hit_policy or self.settings.hit_policy
        images = await self.pull_images(req)
        hashes, fetched = await self._fetch_hits(req, policy)
        try:
            cached, hit = await self._cached_prefix(req, policy, hashes, fetched)
            if cached is not None and not hit.exact:
                self._unshared.add(rid)  # its state is not announced (see EngineRole)
            stream = self.service.generate(
                rid, list(req.token_ids), req.sampling, prefill_only=True, cached=cached, images=images
            )
            async with contextlib.aclosing(stream):
                outputs = [o async for o in stream]
            arrival.settle()
        finally:
            if fetched is not None:
                fetched.release()
            asyncio.get_running_loop().call_later(5.0, self._unshared.discard, rid)
        last = outputs[-1]
        top = [t for o in outputs for t in o.new_top_logprobs]  # the first token's, when asked for
        self.counters.prefills += 1
        stats = self.service.request_stats(rid)
        replay = stats.replay_tokens if stats is not None else 0
        if last.finish_reason != "prefilled":  # the first token already ended it: nothing to hand off
            yield Prefilled(
                lease.lease_id,
                list(last.output),
                list(last.logprobs or []),
                0,
                0,
                0,
                cached_tokens=cached.num_tokens if cached is not None else 0,
                replay_tokens=replay,
                finish=last.finish_reason or "stop",
                top_logprobs=top,
                hit=hit,
            )
            return
        exporting = False
        try:
            if first:
                cached_tokens = cached.num_tokens if cached is not None else 0
                yield FirstToken(rid, list(last.output), list(last.logprobs or []), cached_tokens, top, hit)
            exporting = True
            # Held, not copied: the send reads the pages in the engine's pool, which keeps them
            # until release_held below. Shielded: a caller that goes away now must not leave the
            # prefilled request (or its held pages) behind in the engine.
            export = asyncio.ensure_future(self.service.export(rid, hold=True))
            try:
                state = await asyncio.shield(export)
            except asyncio.CancelledError:
                export.add_done_callback(self._release_exported)
                raise
        finally:
            if not exporting:  # closed at FirstToken (the decode went away): take it out anyway
                self._run_aside(self.service.export(rid))
        remaining = max(0.5, lease.expires_in_s - (time.monotonic() - started))
        try:
            await self.data.send(lease_target(lease), state.to_parts(), timeout_s=remaining)
        except DsiError:
            self.counters.failed_handoffs += 1
            raise
        finally:
            self._run_aside(self.service.release_held(state.held))
        self.counters.handoffs += 1
        yield Prefilled(
            lease.lease_id,
            list(state.output),
            list(state.logprobs),
            state.seed,
            state.consumer_start,
            state.num_computed,
            cached_tokens=state.num_cached,
            replay_tokens=replay,
            replay_start=state.replay_start,
            top_logprobs=top,
            hit=hit,
        )

    def _run_aside(self, coro) -> None:
        """Run ``coro`` as the role's background task (``spawn``: kept, cancelled on stop); its
        result or error is not wanted."""
        self.spawn(coro).add_done_callback(lambda t: t.cancelled() or t.exception())

    def _release_exported(self, export: asyncio.Future) -> None:
        """An export whose caller went away: its held pages go back once it is done."""
        if not export.cancelled() and export.exception() is None and self.service is not None:
            self._run_aside(self.service.release_held(export.result().held))

    async def _fetch_hits(self, req: Generate, policy: HitPolicy) -> tuple[list[bytes], FetchedBlocks | None]:
        """The leading cached blocks of the prompt the policy (or the pinned hit) can use (at least
        its last token is always computed)."""
        shape, bs = self.shape, self.shape.block_size
        limit = (
            req.pin_hit.tokens
            if req.pin_hit is not None
            else fetch_limit(policy, len(req.token_ids), shape.keep, bs, rings=shape.rings)
        )
        usable = limit // bs
        if self.kvstore is None or usable <= 0:
            return [], None
        try:
            extras = image_extras([(s.offset, s.tokens, s.digest) for s in req.images], bs)
            packed = self.shape.hash_chain.hashes(
                req.token_ids[: usable * bs], cache_salt=req.sampling.cache_salt, extras=extras or None
            )
        except (ValueError, OverflowError) as exc:
            raise InvalidRequest(f"prompt token ids: {exc}") from None
        hashes = unpack(packed)
        fetched = await self.kvstore.fetch(hashes, self.shape.page_bytes)
        if not len(fetched):
            fetched.release()
            return hashes, None
        return hashes, fetched

    async def _cached_prefix(
        self, req: Generate, policy: HitPolicy, hashes: list[bytes], fetched: FetchedBlocks | None
    ) -> tuple[CachedPrefix | None, HitChoice]:
        """The hit as the engine takes it (see dsi.engine.hit_policy): exact when the SWA state at
        its end can be pulled from the host that made it (the hit may shrink to where an exact hit
        is possible), else what the policy allows: the whole run of blocks with bounded replay, or
        nothing. A model without SWA rings takes every fetched page, exact, with nothing to pull.
        A re-run takes its pinned hit (``pinned_hit``), or raises HitUnavailable."""
        shape, bs = self.shape, self.shape.block_size
        prompt_len, stored = len(req.token_ids), len(fetched) * bs if fetched is not None else 0
        pin = req.pin_hit
        if not shape.rings:
            boundary = 0
        elif pin is None:  # the SWA state worth pulling: at the exact boundary, or the pinned one
            boundary = exact_boundary(stored, prompt_len, shape.keep, bs)
        else:
            boundary = pin.tokens if pin.exact and stored >= pin.tokens else 0
        rings = await self._pull_state(hashes[boundary // bs - 1], boundary) if boundary > 0 else None
        held = rings is not None or not shape.rings
        if pin is None:
            hit = choose_hit(policy, stored, prompt_len, shape.keep, bs, state_held=held, rings=shape.rings)
        else:
            hit = self._pinned(pin, stored, state_held=held)
        if not hit.tokens or fetched is None:
            return None, NO_HIT
        pages = fetched.torch().view(torch.float32).reshape(len(fetched), shape.page_elems)
        if hit.exact and rings is not None:
            self.counters.states_pulled += 1
            return CachedPrefix(hit.tokens, pages[: hit.tokens // bs], rings), hit
        return CachedPrefix(hit.tokens, pages[: hit.tokens // bs]), hit

    def _pinned(self, pin: HitChoice, stored: int, state_held: bool) -> HitChoice:
        hit = pinned_hit(pin, stored, state_held)
        if hit is None:
            raise HitUnavailable(
                f"{self.name}: the re-run is pinned to a bounded-replay hit of {pin.tokens} "
                f"tokens, and the store now holds {stored} of them"
            )
        return hit

    async def _pull_state(self, block_hash: bytes, boundary: int) -> torch.Tensor | None:
        """The producer ring snapshot at ``boundary``, from this host or the one that announced it."""
        assert self.kvstore is not None and self.data is not None
        local = self.states.get(block_hash)
        if local is not None:
            return local[1] if local[0] == boundary else None
        owner = await self.kvstore.find_state(block_hash)
        if not owner or owner == self.settings.address:
            return None
        shape = self.shape.ring_shape
        transfer = transfer_id(self.name, "state")
        inbound = self.data.expect(transfer, self.shape.ring_bytes, self.state_pull_timeout_s)
        try:
            peer = await self.peer(owner, self.state_pull_timeout_s)
            lease = self.lease(inbound, 0, self.state_pull_timeout_s)
            pulled: StatePulled = await peer.ask(
                PullState(block_hash, lease), timeout=self.state_pull_timeout_s
            )
            if pulled.boundary != boundary:
                return None
            buf = await inbound.wait()
            return torch.frombuffer(bytearray(buf), dtype=torch.float32).view(shape)
        except DsiError as exc:  # gone, evicted, slow: replay instead
            log.info("%s: SWA state not pulled from %s (%s); replaying", self.name, owner, exc.code)
            return None
        finally:
            inbound.release()
