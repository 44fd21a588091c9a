"""DecodeActor: continuous batching over requests prefilled elsewhere (or here), KV persistence.

Two ways in, both streams of TokenChunk:

- ``Handoff`` (disaggregated): reserve pages + a state slot and a data-plane receive region under
  a lease, ask the chosen prefill to fill it (``PrefillStream``; ``PrefillTo`` to a prefill of
  protocol version 3), stream the first token as soon as the prefill sends it (``FirstToken``,
  before the KV arrives), import the state into the reserved pages and decode. Whatever goes
  wrong before the import - the prefill dies, times out, or the lease expires - releases the
  lease and answers ``PrefillLost`` so the entrypoint retries on another prefill (after a first
  token, as a re-run checked against it); a prefill's ``InvalidRequest`` and ``HitUnavailable``
  pass through unchanged (never retried). The first chunk carries the prefix hit the prefill took.
- ``Generate`` (colocated): prompt and continuation on this engine, for clusters without prefill
  instances. It takes no prefix hit, so a re-run pinned to a bounded-replay hit is refused
  (``HitUnavailable``).

Every page of a request that fills up (prompt pages arriving in a handoff included, except the
ones its prefix hit loaded from the store) is persisted to the kvstore in the background under
its chain hash and the request's traffic class; a store that is down delays or drops puts
(counted), never requests. What the store holds is always what a hit-free run computes: pages
of a request served with a bounded-replay hit, and of salted requests, are not persisted, and
their SWA states are not announced. Leaving a stream early, or an ``Abort`` tell,
aborts the request in the engine.

Drain (``DrainOrder`` from the controller): live migration of every running request to the
other decodes (:mod:`dsi.roles.decode.migration`), whose streams end here with
``finish="migrated"`` naming the new owner; ``Precopy`` / ``MigrateIn`` / ``Resume`` are the
receiving end (:mod:`dsi.roles.decode.arrivals`). Then the role retires.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

from dsi.actor import handles
from dsi.engine import RequestMoved, RequestOutput, RequestState, Reservation
from dsi.engine.hit_policy import NO_HIT, HitChoice
from dsi.errors import DsiError, InvalidRequest, Overloaded
from dsi.messages.gateway import Abort, Generate, TokenChunk
from dsi.messages.handoff import (
    FirstToken,
    Handoff,
    HitUnavailable,
    Prefilled,
    PrefillLost,
    PrefillStream,
    PrefillTo,
)
from dsi.messages.migrate import DrainOrder, MigrateCancel, MigrateIn, MigrationLeases, Precopy, Resume
from dsi.roles.controller.lifecycle import IllegalTransition
from dsi.roles.decode.arrivals import Arrivals
from dsi.roles.decode.migration import Migration
from dsi.roles.engine_role import EngineRole, EngineRoleSettings
from dsi.roles.run_fence import check_run
from dsi.transport.kv.ids import transfer_id

log = logging.getLogger(__name__)
FIRST_TOKEN_VERSION = 4  # the protocol version whose prefills answer PrefillStream


@dataclass(slots=True)
class _Meta:
    traffic_class: str
    stored_pages: int = 0  # leading pages the store already has (the prefix hit)
    cached_tokens: int = 0  # what the request's chunks report
    kv_tokens: int = 0  # prompt tokens (for placing it when it migrates)


class DecodeActor(EngineRole):
    kind = "decode"
    collect_full_pages = True
    speculates = True

    def __init__(self, name: str, settings: EngineRoleSettings) -> None:
        super().__init__(name, settings)
        self._meta: dict[str, _Meta] = {}  # engine request id -> how its pages are persisted
        self.live: dict[str, _Meta] = {}  # requests streaming from here now
        self.arrivals = Arrivals(self)
        self.migration: Migration | None = None

    # ---- colocated -------------------------------------------------------------------------
    @handles
    async def generate(self, msg: Generate) -> AsyncIterator[TokenChunk]:
        assert self.service is not None
        check_run(self.name, self.started_at, msg.instance_run)
        if msg.pin_hit is not None and msg.pin_hit.tokens and not msg.pin_hit.exact:
            raise HitUnavailable(
                f"{self.name}: a colocated run takes no prefix hit, and the re-run is pinned to a "
                f"bounded-replay hit of {msg.pin_hit.tokens} tokens"
            )
        self._remember(msg.request_id, msg)
        self.arrive(0).settle()  # the engine counts it from here
        prompt_tokens = len(msg.token_ids)
        images = await self.pull_images(msg)
        stream = self.service.generate(msg.request_id, list(msg.token_ids), msg.sampling, images=images)
        seq = itertools.count(1)  # the chunks' numbers (TokenChunk.seq)
        try:
            first = await anext(stream)
            yield _chunk(msg.request_id, first, prompt_tokens, next(seq), hit=NO_HIT)
            if not first.finished:
                async for chunk in self._continue(msg.request_id, stream, seq, prompt_tokens):
                    yield chunk
        finally:
            await stream.aclose()
            self.load_changed()
            self._forget(msg.request_id)

    # ---- disaggregated -----------------------------------------------------------------------
    @handles
    async def handoff(self, msg: Handoff) -> AsyncIterator[TokenChunk]:
        assert self.service is not None and self.data is not None
        req = msg.request
        check_run(self.name, self.started_at, req.instance_run)
        if not req.token_ids:
            raise InvalidRequest("the prompt is empty")
        num_blocks = self.shape.blocks(len(req.token_ids))
        layout = self.shape.state_layout(num_blocks, sum(s.tokens for s in req.images))
        reservation = await self._reserve(num_blocks)
        arrival = self.arrive(len(req.token_ids))  # counted here until the engine holds it
        lease_id = transfer_id(self.name, req.request_id)
        timeout = self.settings.lease_timeout_s
        inbound = self.data.expect(lease_id, layout.nbytes, timeout)
        self.counters.leases += 1
        try:
            done: Prefilled | None = None
            first: FirstToken | None = None
            call = PrefillStream(req, self.lease(inbound, num_blocks, timeout))
            async with contextlib.aclosing(self._prefill(msg, call, timeout)) as items:
                async for item in items:
                    if isinstance(item, FirstToken) and first is None:
                        first = item
                        yield _first_chunk(req, item)
                    elif isinstance(item, Prefilled):
                        done = item
            if done is None:
                raise PrefillLost(f"prefill {msg.prefill_id or msg.prefill} ended without Prefilled")
            if done.finish:  # the first token ended it: nothing was written
                yield _first_chunk(req, done, done.finish)
                return
            try:
                buf = await inbound.wait()
            except DsiError as exc:
                raise PrefillLost(
                    f"KV from {msg.prefill_id or msg.prefill} did not arrive: {exc.message}"
                ) from None
            state = RequestState.from_buffer(
                layout,
                buf,
                req.request_id,
                list(req.token_ids),
                list(done.output),
                req.sampling,
                done.seed,
                done.consumer_start,
                done.num_computed,
                list(done.logprobs),
                done.cached_tokens,
                done.replay_start,
                [(s.offset, s.tokens, s.digest) for s in req.images],
            )
            self._remember(req.request_id, req, done)
            stream = self.service.import_request(state, reservation)
            inbound.release()  # the engine copied the state into the reserved pages
            arrival.settle()
            if first is None:  # the prefill sent no FirstToken: the first chunk goes now
                yield _first_chunk(req, done)
            async with contextlib.aclosing(stream):
                async for chunk in self._continue(
                    req.request_id, stream, itertools.count(2), len(req.token_ids), done.cached_tokens
                ):
                    yield chunk
        finally:
            self.counters.leases -= 1
            arrival.settle()
            inbound.release()
            await self.service.release(reservation)  # a no-op once the import took it
            self._forget(req.request_id)

    async def _reserve(self, num_blocks: int) -> Reservation:
        """Pages + a slot; a caller cancelled meanwhile does not strand them."""
        assert self.service is not None
        service = self.service
        call = asyncio.ensure_future(service.reserve(num_blocks))
        try:
            return await asyncio.shield(call)
        except InvalidRequest as exc:  # no room here now: the entrypoint tries another decode
            raise Overloaded(f"{self.name}: {exc.message}") from None
        except asyncio.CancelledError:
            call.add_done_callback(
                lambda f: (
                    None
                    if f.cancelled() or f.exception()
                    else asyncio.ensure_future(service.release(f.result()))
                )
            )
            raise

    async def _prefill(
        self, msg: Handoff, call: PrefillStream, timeout: float
    ) -> AsyncIterator[FirstToken | Prefilled]:
        """The prefill's answers: ``FirstToken`` (when the request goes on), then ``Prefilled``;
        a prefill of protocol version 3 is asked ``PrefillTo`` and answers ``Prefilled`` only."""
        try:
            peer = await self.peer(msg.prefill, timeout)
            if peer.welcome is not None and peer.welcome.version < FIRST_TOKEN_VERSION:
                yield await peer.ask(PrefillTo(call.request, call.lease), timeout=timeout)
                return
            async with contextlib.aclosing(peer.stream(call, timeout=timeout)) as items:
                async for item in items:
                    yield item
        except (InvalidRequest, HitUnavailable):  # another prefill would refuse it too
            raise
        except DsiError as exc:  # unreachable, lost, timed out, failed
            self.counters.failed_handoffs += 1
            raise PrefillLost(
                f"prefill {msg.prefill_id or msg.prefill} failed: {exc.code}: {exc.message}"
            ) from None

    async def _continue(
        self,
        request_id: str,
        stream: AsyncIterator[RequestOutput],
        seq: Iterator[int],
        prompt_tokens: int,
        cached_tokens: int = 0,
    ) -> AsyncIterator[TokenChunk]:
        """The chunks of a running request, numbered from ``seq``; a request moved off by a drain
        ends with a ``migrated`` chunk naming its new owner."""
        meta = self._meta.get(request_id)
        self.live[request_id] = _Meta(
            meta.traffic_class if meta else "chatbot", 0, cached_tokens, prompt_tokens
        )
        try:
            async for out in stream:
                yield _chunk(request_id, out, prompt_tokens, next(seq), cached_tokens)
        except RequestMoved:
            assert self.migration is not None
            target = await self.migration.destination(request_id)
            yield TokenChunk(
                request_id, [], "migrated", prompt_tokens, cached_tokens, moved_to=target, seq=next(seq)
            )
        finally:
            self.live.pop(request_id, None)

    # ---- drain: live migration -----------------------------------------------------------------
    @handles
    async def drain_order(self, msg: DrainOrder) -> None:
        if msg.cancel:
            if self.migration is not None:
                await self.migration.cancel()
                self.migration = None
            return
        if self.migration is None:
            self.migration = Migration(self, msg.grace_s)
            self.migration.start()

    @handles(concurrent=True)
    async def precopy(self, msg: Precopy) -> MigrationLeases:
        self._refuse_arrivals()
        return await self.arrivals.precopy(msg)

    @handles(concurrent=True)
    async def migrate_in(self, msg: MigrateIn) -> MigrationLeases:
        self._refuse_arrivals()
        return await self.arrivals.migrate_in(msg)

    @handles
    def migrate_cancel(self, msg: MigrateCancel) -> None:
        self.arrivals.cancel(msg.request_ids)

    @handles
    async def resume(self, msg: Resume) -> AsyncIterator[TokenChunk]:
        migrant, outputs = await self.arrivals.resume(msg.request_id, self.settings.lease_timeout_s)
        self._meta[msg.request_id] = _Meta(migrant.traffic_class, migrant.num_cached // self.shape.block_size)
        if migrant.replay_start < migrant.num_cached:  # a bounded-replay hit: not shared (see EngineRole)
            self._unshared.add(msg.request_id)
        prompt_tokens = len(migrant.prompt)
        try:
            yield TokenChunk(
                msg.request_id,
                list(migrant.output),
                "",
                prompt_tokens,
                migrant.cached_tokens,
                list(migrant.logprobs),
                seq=1,
            )
            async with contextlib.aclosing(outputs):  # type: ignore[type-var]
                async for chunk in self._continue(
                    msg.request_id, outputs, itertools.count(2), prompt_tokens, migrant.cached_tokens
                ):
                    yield chunk
        finally:
            self._forget(msg.request_id)

    def _refuse_arrivals(self) -> None:
        if self.migration is not None:
            raise IllegalTransition(f"{self.name} is draining: it takes no migrated requests")

    async def on_stop(self) -> None:
        self.arrivals.close()
        await super().on_stop()

    @handles
    async def abort(self, msg: Abort) -> None:
        if self.service is not None:
            self.service.abort(msg.request_id)

    # ---- persistence ---------------------------------------------------------------------------
    def _remember(self, request_id: str, msg: Generate, done: Prefilled | None = None) -> None:
        stored = done.cached_tokens // self.shape.block_size if done is not None else 0
        self._meta[request_id] = _Meta(msg.traffic_class, stored)
        if done is not None and done.replay_start < done.cached_tokens:  # a bounded-replay hit
            self._unshared.add(request_id)

    def _forget(self, request_id: str) -> None:
        # Pages and states of the request's last step are taken after it; keep the meta briefly.
        def drop() -> None:
            self._meta.pop(request_id, None)
            self._unshared.discard(request_id)

        asyncio.get_running_loop().call_later(5.0, drop)

    def on_full_pages(self, pages: list) -> None:
        if self.kvstore is None:
            return
        by_class: dict[str, tuple[list[bytes], list]] = {}
        for page in pages:
            meta = self._meta.get(page.request_id)
            if meta is None or page.request_id in self._unshared or page.index < meta.stored_pages:
                continue
            hashes, blocks = by_class.setdefault(meta.traffic_class, ([], []))
            hashes.append(page.block_hash)
            blocks.append(page.data.numpy())
        for traffic_class, (hashes, blocks) in by_class.items():
            self.kvstore.put_background(hashes, blocks, traffic_class)
            self.counters.persisted_blocks += len(hashes)


def _first_chunk(req: Generate, item: FirstToken | Prefilled, finish: str = "") -> TokenChunk:
    """Chunk 1 of a handoff: what the prefill sampled (``FirstToken`` or ``Prefilled``) and the
    prefix hit it took."""
    return TokenChunk(
        req.request_id,
        list(item.output),
        finish,
        len(req.token_ids),
        item.cached_tokens,
        list(item.logprobs),
        list(item.top_logprobs),
        item.hit,
        seq=1,
    )


def _chunk(
    request_id: str,
    out: RequestOutput,
    prompt_tokens: int,
    seq: int,
    cached_tokens: int = 0,
    hit: HitChoice | None = None,
) -> TokenChunk:
    return TokenChunk(
        request_id,
        out.new_tokens,
        out.finish_reason or "" if out.finished else "",
        prompt_tokens,
        cached_tokens,
        out.new_logprobs,
        out.new_top_logprobs,
        hit,
        seq=seq,
    )
