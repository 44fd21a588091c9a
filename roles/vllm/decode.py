"""VllmDecodeActor: a decode instance whose engine is vLLM.

Two ways in, both streams of TokenChunk, as for dsi's own decode (dsi.roles.decode):

- ``Generate`` (colocated): prompt and continuation in this vLLM. The prompt's full blocks are
  looked up in the kvstore first, past those vLLM's own prefix cache holds (a hit is staged and
  loaded, vLLM computes only the rest); those the store lacks are staged by the connector when
  the prompt completes and queued for the store with the first token, so any instance can hit
  them next (a failover's re-run among them).
- ``Handoff`` (disaggregated):

      decode                                   prefill (VllmPrefillActor)
        lease: a receive region for the prompt's KV blocks (KvLayout.block_bytes each)
        PrefillTo(request, lease)  ------------>  vLLM runs the prompt for one token; dsi's
                                                  connector stages the prompt's blocks
        receive region  <------ data plane -----  the staged blocks
        <------------------------------------  Prefilled(first token)
        stage the blocks; vLLM runs the prompt: the connector reports all of it but the last
        token as matched and loads those blocks, so vLLM computes only the last prompt token
        (its first output is the prefill's first token, recomputed here) and decodes on.

  A prefill that fails, vanishes or times out before the KV arrived answers ``PrefillLost``
  (the entrypoint retries on another prefill); its ``InvalidRequest`` passes through.

Drain (``DrainOrder``): new requests are refused (``Overloaded``: the entrypoint routes them
elsewhere); after the grace period every request still running here ends with
``finish="migrated"`` naming no decode, so the entrypoint re-runs it on another decode and checks
the re-run against the tokens already delivered; then the role retires.

Re-runs (after a drain, or a decode that died): a greedy request without penalties continues
after the tokens the client has, prefilling them with its prompt (dsi.roles.vllm.resume); the
rest run from their prompt again. Either way the prompt's pages are store hits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec

from dsi.actor import handles
from dsi.engine.hit_policy import NO_HIT
from dsi.errors import DsiError, InvalidRequest, Overloaded
from dsi.messages.gateway import Abort, Generate, TokenChunk
from dsi.messages.handoff import Handoff, HitUnavailable, KvLease, Prefilled, PrefillLost, PrefillTo
from dsi.messages.migrate import DrainOrder
from dsi.roles.run_fence import check_run
from dsi.roles.vllm.resume import echoed, resumable, resumed
from dsi.roles.vllm.role import VllmRole, VllmRoleSettings
from dsi.transport.kv.ids import transfer_id
from dsi.vllm.service import VllmOutput
from dsi.vllm.wiring import hit_params, load_params

log = logging.getLogger(__name__)


class _Moved(Exception):
    """Ends a stream of a request a drain takes away from this decode."""


class VllmDecodeActor(VllmRole):
    kind = "decode"

    def __init__(self, name: str, settings: VllmRoleSettings) -> None:
        super().__init__(name, settings)
        self.live: dict[str, str] = {}  # gateway request id -> vLLM request id, streaming now
        self._moving: asyncio.Event = asyncio.Event()  # set when a drain's grace period ends
        self._drain: asyncio.Task | None = None

    def requests_here(self) -> int:
        return len(self.live)

    # ---- colocated -------------------------------------------------------------------------
    @handles
    async def generate(self, msg: Generate) -> AsyncIterator[TokenChunk]:
        self._admit(msg)
        if resumable(msg):
            async for chunk in self._resume(msg):
                yield chunk
            return
        async for chunk in self._colocated(msg):
            yield chunk

    async def _resume(self, msg: Generate) -> AsyncIterator[TokenChunk]:
        """A re-run continued after the delivered tokens (see dsi.roles.vllm.resume)."""
        echo, prompt = msg.delivered[:-1], len(msg.token_ids)
        self.counters.resumed += 1
        log.info(
            "%s: request %s resumed after %d delivered tokens", self.name, msg.request_id, len(msg.delivered)
        )
        first = True
        async for chunk in self._colocated(resumed(msg)):
            chunk = msgspec.structs.replace(chunk, prompt_tokens=prompt)
            if first and chunk.finish != "migrated":
                chunk, first = echoed(chunk, echo), False
            yield chunk

    async def _colocated(self, msg: Generate) -> AsyncIterator[TokenChunk]:
        if msg.pin_hit is not None and msg.pin_hit.tokens and not msg.pin_hit.exact:
            raise HitUnavailable(
                f"{self.name}: a colocated run takes no prefix hit, and the re-run is pinned to a "
                f"bounded-replay hit of {msg.pin_hit.tokens} tokens"
            )
        arrival = self.arrive(len(msg.token_ids))
        tag = f"{msg.request_id}.{secrets.token_hex(4)}"
        hit, staged = self.staged(f"{tag}.hit"), self.staged(f"{tag}.save")
        try:
            assert self.layout is not None
            hashes = self.prompt_hashes(msg) if self.kvstore is not None else []
            local = self.held_locally(hashes)
            found = await self.fetch_hit(hashes, hit, skip=local)
            known = local + found  # blocks vLLM holds or loads: the store has them too
            tokens = known * self.layout.block_size
            params, persist = None, None
            if len(hashes) > known:  # pages the store lacks: stage them to persist
                params = hit_params(staged, hit, tokens, found, first=local, save_from=known, full_only=True)
                persist = (staged, hashes, known, msg.traffic_class, known)
            elif found:
                params = load_params(hit, tokens, found, first=local)
            arrival.settle()
            computes = len(msg.token_ids) - tokens
            stream = self._tokens(
                msg, params, cached_tokens=None, staged=hit, persist=persist, computes=computes
            )
            async for chunk in stream:
                yield chunk
        finally:
            arrival.settle()
            hit.unlink(missing_ok=True)
            staged.unlink(missing_ok=True)

    # ---- disaggregated -----------------------------------------------------------------------
    @handles
    async def handoff(self, msg: Handoff) -> AsyncIterator[TokenChunk]:
        assert self.data is not None and self.layout is not None
        req = msg.request
        self._admit(req)
        if resumable(req):  # no prefill: the prompt and the delivered tokens run here
            async for chunk in self._resume(req):
                yield chunk
            return
        prompt = len(req.token_ids)
        num_blocks = self.layout.blocks(prompt)
        nbytes = num_blocks * self.layout.block_bytes
        arrival = self.arrive(prompt)
        lease_id = transfer_id(self.name, req.request_id)
        timeout = self.settings.node.data_plane.lease_timeout_s
        inbound = self.data.expect(lease_id, nbytes, timeout)
        target = inbound.target
        lease = KvLease(lease_id, target.backend, target.address, nbytes, num_blocks, timeout, target.region)
        staged = self.staged(lease_id)
        self.counters.leases += 1
        try:
            done = await self._prefill(msg, PrefillTo(req, lease), timeout)
            if done.finish:  # the first token ended it: nothing was written
                yield TokenChunk(req.request_id, done.output, done.finish, prompt, done.cached_tokens,
                                 done.logprobs, done.top_logprobs, NO_HIT, seq=1)  # fmt: skip
                return
            try:
                buf = await inbound.wait()
            except DsiError as exc:
                raise PrefillLost(
                    f"KV from {msg.prefill_id or msg.prefill} did not arrive: {exc.message}"
                ) from None
            await asyncio.get_running_loop().run_in_executor(None, staged.write_bytes, buf)
            inbound.release()
            arrival.settle()
            params = load_params(staged, prompt - 1, num_blocks)
            self.counters.handoffs += 1
            async for chunk in self._tokens(req, params, cached_tokens=done.cached_tokens, staged=staged):
                yield chunk
        finally:
            self.counters.leases -= 1
            arrival.settle()
            inbound.release()
            staged.unlink(missing_ok=True)

    async def _prefill(self, msg: Handoff, call: PrefillTo, timeout: float) -> Prefilled:
        try:
            peer = await self.peer(msg.prefill, timeout)
            return await peer.ask(call, timeout=timeout)
        except (InvalidRequest, HitUnavailable):  # another prefill would refuse it too
            raise
        except DsiError as exc:
            self.counters.failed_handoffs += 1
            raise PrefillLost(
                f"prefill {msg.prefill_id or msg.prefill} failed: {exc.code}: {exc.message}"
            ) from None

    # ---- streaming -----------------------------------------------------------------------------
    def _admit(self, msg: Generate) -> None:
        check_run(self.name, self.started_at, msg.instance_run)
        if self._drain is not None:
            raise Overloaded(f"{self.name} is draining: it takes no new requests")
        if not msg.token_ids:
            raise InvalidRequest("the prompt is empty")
        if msg.images:
            raise InvalidRequest("vLLM-backed instances of dsi serve text prompts only")

    async def _tokens(
        self,
        msg: Generate,
        params: dict | None,
        *,
        cached_tokens: int | None,
        staged: Path | None = None,
        persist: tuple[Path, list[bytes], int, str, int] | None = None,
        computes: int = 0,
    ) -> AsyncIterator[TokenChunk]:
        """The request's chunks from vLLM; the first carries the (empty) prefix hit. ``cached_tokens``:
        the prompt tokens a handoff's prefill took from the store, or None for a colocated run
        (vLLM's own prefix cache hit, local or loaded, then counts). ``staged``: the file vLLM
        loads, removed once it has. ``persist``: ``VllmRole.persist``'s arguments (file, hashes,
        first new block, traffic class, the file's first block) of a colocated run whose new prompt
        blocks the connector stages, queued for the kvstore once the first token shows the prompt
        done. ``computes``: the prompt tokens computed here (a colocated run), reported as queued
        prefill work until the first token."""
        assert self.service is not None
        rid, prompt = msg.request_id, len(msg.token_ids)
        vid = self.live[rid] = f"{rid}.{secrets.token_hex(3)}"
        stream = self.service.generate(vid, list(msg.token_ids), msg.sampling, params)
        first, seq = True, 0  # seq: the last chunk's number (TokenChunk.seq)
        self.starts(vid, prompt, computes)
        try:
            async with contextlib.aclosing(stream):
                while True:
                    out = await self._next(stream)
                    if first:
                        self.started(vid)
                    seq += 1
                    if out is None:
                        yield TokenChunk(rid, [], "migrated", prompt, cached_tokens or 0, seq=seq)
                        return
                    if cached_tokens is None:
                        cached_tokens = out.cached_tokens
                    if first and staged is not None:
                        staged.unlink(missing_ok=True)  # loaded: vLLM computed its first step
                    if first and persist is not None:
                        self.persist(*persist)
                        persist[0].unlink(missing_ok=True)
                    yield _chunk(rid, out, prompt, cached_tokens, first, seq)
                    first = False
                    if out.finished:
                        return
        finally:
            self.started(vid)
            self.live.pop(rid, None)
            self.load_changed()

    async def _next(self, stream: AsyncIterator[VllmOutput]) -> VllmOutput | None:
        """The next output, or None once a drain's grace period is over."""
        step = asyncio.ensure_future(anext(stream))
        moving = asyncio.ensure_future(self._moving.wait())
        try:
            await asyncio.wait((step, moving), return_when=asyncio.FIRST_COMPLETED)
        finally:
            moving.cancel()
        if step.done():
            return step.result()
        step.cancel()
        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration, DsiError):
            await step
        return None

    @handles
    async def abort(self, msg: Abort) -> None:
        vid = self.live.get(msg.request_id)
        if vid is not None and self.service is not None:
            await self.service.abort(vid)

    # ---- drain ---------------------------------------------------------------------------------
    @handles
    async def drain_order(self, msg: DrainOrder) -> None:
        if msg.cancel:
            if self._drain is not None and not self._moving.is_set():
                self._drain.cancel()
                self._drain = None
            return
        if self._drain is None:
            self._drain = asyncio.get_running_loop().create_task(self._drain_then_retire(msg.grace_s))

    async def _drain_then_retire(self, grace_s: float) -> None:
        loop = asyncio.get_running_loop()
        ends = loop.time() + grace_s
        while self.live and loop.time() < ends:
            await asyncio.sleep(0.05)
        if self.live:
            log.info("%s: grace period over; %d requests re-run elsewhere", self.name, len(self.live))
        self._moving.set()
        while self.live:
            await asyncio.sleep(0.02)
        self.retire("drained")


def _chunk(rid: str, out: VllmOutput, prompt: int, cached_tokens: int, first: bool, seq: int) -> TokenChunk:
    return TokenChunk(
        rid,
        out.new_tokens,
        out.finish_reason if out.finished else "",
        prompt,
        cached_tokens,
        out.logprobs,
        out.top_logprobs,
        NO_HIT if first else None,
        seq=seq,
    )
