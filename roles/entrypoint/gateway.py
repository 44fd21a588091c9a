"""Gateway: one HTTP request of any protocol -> an engine request -> the protocol's response.

    body --recipe (parse, render, encode)--> Prepared(token ids, SamplingParams, OutputOptions)
         --PrefixLookup (CHECK replica, no I/O)--> predicted cached tokens, in Generate and metrics
         --DecodePool.generate--> TokenChunk per engine step (ids, logprobs, the cached tokens
                                  the engine reused: what usage reports)
         --OutputStream.feed--> SSE pieces (the steps of one turn of the event loop in one write) or, at the end, one JSON body

The request leaves the engine as soon as the client is gone (its stream is closed, which sends
CANCEL to the instance) or the output is complete (EOS, a stop string, a finished tool call).
A failure after the stream began (no decode left to re-run on, a re-run that diverged from the
tokens sent; see dsi.roles.entrypoint.recovery) ends it with the protocol's error event.

Every request leaves one access log line (dsi.roles.entrypoint.access_log). Shutdown drains:

    serving --drain(timeout_s)--> draining: /health 503 "draining", a new request 503 (its
        protocol's error body, Connection: close); the requests in flight go on
        --> the last one ends, or timeout_s passes --> the caller closes the listener
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

import msgspec
from aiohttp import web
from tokenizers import Tokenizer

from dsi.engine.hit_policy import DEFAULT_HIT_POLICY, HitPolicy, predicted_hit
from dsi.engine.params import SamplingParams
from dsi.errors import DsiError, InvalidRequest
from dsi.kvcache.hashchain import image_extras
from dsi.messages.gateway import Generate, ImageSpan
from dsi.recipe import RequestError, error_body
from dsi.recipe.emit_common import OutputOptions
from dsi.recipe.emit_stream import OutputStream
from dsi.recipe.parser import ControlIds
from dsi.recipe.vision_prompt import PlacedImage
from dsi.roles.entrypoint.access_log import AccessRecord, log_access
from dsi.roles.entrypoint.auth import ApiKeys, Caller, TooManyRequests
from dsi.roles.entrypoint.backends import DecodePool, NoInstance
from dsi.roles.entrypoint.encoders import EncoderPool
from dsi.roles.entrypoint.errors import error_response
from dsi.roles.entrypoint.metrics import Metrics
from dsi.roles.entrypoint.prefix import PrefixLookup
from dsi.roles.entrypoint.sse import ClientGone, SlowReader, SseStream, TurnWrites, open_sse

log = logging.getLogger(__name__)

TRAFFIC_CLASS_HEADER = "x-dsi-traffic-class"  # overrides the API key's class for one request


@dataclass(slots=True)
class Prepared:
    """A validated request, ready for the engine and the emitter."""

    request_id: str
    token_ids: list[int]
    sampling: SamplingParams
    options: OutputOptions
    stream: bool
    traffic_class: str = "chatbot"
    hit_policy: HitPolicy = DEFAULT_HIT_POLICY
    # A model of another family: its tokenizer and the ids the output parser acts on (EOS).
    tokenizer: Tokenizer | None = None
    control: ControlIds | None = None
    images: tuple[PlacedImage, ...] = ()  # decoded images and where their tokens are

    def image_spans(self) -> list[ImageSpan]:
        return [ImageSpan(p.offset, p.image.tokens, p.image.digest) for p in self.images]


class Gateway:
    """``keep``: the served model's decoder-side keep, for the hit an ``exact`` policy can take;
    ``rings``: whether it keeps SWA rings (without, every stored page is an exact hit).
    ``slow_reader_timeout_s``: a stream whose client reads nothing for this long is aborted,
    and its engine request with it (see dsi.roles.entrypoint.sse). ``prepare_in_thread``: run
    the preparer in a worker thread, as it blocks when it fetches image URLs. ``worker``: the
    HTTP worker's id, for the access log."""

    def __init__(
        self,
        pool: DecodePool,
        keys: ApiKeys,
        metrics: Metrics,
        preparer,
        prefix: PrefixLookup | None = None,
        keep: int | None = None,
        slow_reader_timeout_s: float = 30.0,
        rings: bool = True,
        encoders: EncoderPool | None = None,
        prepare_in_thread: bool = False,
        worker: str = "",
    ) -> None:
        self.pool = pool
        self.keys = keys
        self.metrics = metrics
        self.prepare = preparer  # (protocol, body bytes, traffic class) -> Prepared; raises RequestError
        self.prefix = prefix  # None: no kvstore, every prompt is a miss
        self.keep = keep
        self.rings = rings
        self.encoders = encoders  # None: no vision encoder, a request with images is a 503
        self.prepare_in_thread = prepare_in_thread
        metrics.sources.append(pool.metric_lines)
        self.slow_reader_timeout_s = slow_reader_timeout_s
        self._turns = TurnWrites()  # the streams' end-of-turn writes, one callback for all
        if prefix is not None:
            metrics.sources.append(prefix.metric_lines)
        self.worker = worker
        self.draining = False
        self._idle = asyncio.Event()  # set while draining once no request is in flight

    async def handle(self, request: web.Request, protocol: str) -> web.StreamResponse:
        # The streaming path is kept to few coroutine frames (handle -> _stream -> _run): every
        # token's resumption passes through each of them.
        access = AccessRecord(request.path, protocol, self.worker, time.perf_counter())
        try:
            if self.draining:
                resp = self._error(protocol, 503, "the gateway is shutting down; retry on another")
                resp.force_close()
                return _answered(access, resp)
            caller = self.keys.authenticate(
                request.headers.get("Authorization"), request.headers.get("x-api-key")
            )
            if caller is None:
                return _answered(access, self._error(protocol, 401, "missing or invalid API key"))
            access.key_name = caller.entry.name
            try:
                self.keys.acquire(caller)
            except TooManyRequests as exc:
                return _answered(access, self._error(protocol, 429, str(exc)))
            self.metrics.in_flight += 1
            try:
                ready = await self._prepared(request, protocol, caller, access)
                if isinstance(ready, web.StreamResponse):
                    return _answered(access, ready)
                prep, msg = ready
                if prep.stream:
                    return _answered(access, await self._stream(request, protocol, prep, msg, access))
                return _answered(access, await self._complete(protocol, prep, msg, access))
            finally:
                self.metrics.in_flight -= 1
                self.keys.release(caller)
                if self.draining and not self.metrics.in_flight:
                    self._idle.set()
        except asyncio.CancelledError:  # the client disconnected (handler_cancellation)
            access.finish_reason = access.finish_reason or "client_gone"
            raise
        finally:
            log_access(access)

    def begin_drain(self) -> None:
        """Refuse new requests from now on (503, and /health says "draining")."""
        self.draining = True
        if not self.metrics.in_flight:
            self._idle.set()

    async def drain(self, timeout_s: float) -> int:
        """``begin_drain``, then wait until no request is in flight, at most ``timeout_s``
        seconds. The requests still in flight then."""
        self.begin_drain()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        return self.metrics.in_flight

    async def _prepared(
        self, request: web.Request, protocol: str, caller: Caller, access: AccessRecord
    ) -> tuple[Prepared, Generate] | web.Response:
        """The request and its engine message, or the error response that refuses it."""
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge as exc:
            return self._error(protocol, 413, exc.text or "request body too large")
        traffic_class = request.headers.get(TRAFFIC_CLASS_HEADER, caller.entry.traffic_class)
        try:
            if self.prepare_in_thread:
                prep = await asyncio.to_thread(self.prepare, protocol, body, traffic_class)
            else:
                prep = self.prepare(protocol, body, traffic_class)
        except RequestError as exc:
            self.metrics.request_done(protocol, exc.status)
            self.metrics.error(f"http_{exc.status}")
            return web.json_response(error_body(exc, protocol), status=exc.status)
        access.request_id, access.prompt_tokens = prep.request_id, len(prep.token_ids)
        self.metrics.prompt_tokens += len(prep.token_ids)
        salt = caller.entry.cache_salt
        spans = prep.image_spans()
        cached = self._cached_tokens(prep.token_ids, salt, prep.hit_policy, spans)
        sampling = msgspec.structs.replace(prep.sampling, cache_salt=salt) if salt else prep.sampling
        encoder = ""
        if prep.images:
            try:
                if self.encoders is None:
                    raise NoInstance("this gateway has no vision encoder")
                encoder = await self.encoders.encode(prep.request_id, [p.image for p in prep.images])
            except DsiError as exc:
                log.warning("request %s: images not encoded: %s", prep.request_id, exc)
                return self._error(
                    protocol, 503, f"the images could not be encoded: {exc.code}: {exc.message}"
                )
        msg = Generate(
            prep.request_id,
            prep.token_ids,
            sampling,
            traffic_class=prep.traffic_class,
            cached_tokens=cached,
            hit_policy=prep.hit_policy,
            images=spans,
            encoder=encoder,
        )
        return prep, msg

    def _cached_tokens(
        self, token_ids: list[int], cache_salt: str, policy: HitPolicy, images: list[ImageSpan]
    ) -> int:
        """The prompt's prefix hit per the CHECK replica (metadata only: no I/O on this path), as
        the request's hit policy would take it (see dsi.engine.hit_policy.predicted_hit). A
        prediction: the engine may reuse less (a corrupt block, the store away, no SWA state for
        an exact hit), and usage reports what it reused."""
        if self.prefix is None:
            hit = 0
        else:
            bs = self.prefix.chain.block_size
            extras = image_extras([(s.offset, s.tokens, s.digest) for s in images], bs) if images else None
            stored = self.prefix.cached_tokens(token_ids, cache_salt, extras)
            hit = predicted_hit(policy, stored, len(token_ids), self.keep, bs, rings=self.rings)
        self.metrics.prefix_lookup_tokens += len(token_ids)
        self.metrics.prefix_hit_tokens += hit
        return hit

    async def _complete(
        self, protocol: str, prep: Prepared, msg: Generate, access: AccessRecord
    ) -> web.Response:
        out = OutputStream(prep.options, tokenizer=prep.tokenizer, control=prep.control)
        try:
            await self._run(out, msg, None, access)
        except NoInstance as exc:
            return self._error(protocol, 503, str(exc))
        except InvalidRequest as exc:
            return self._error(protocol, 400, exc.message)
        self.metrics.request_done(protocol, out.http_status)
        return web.json_response(out.body(), status=out.http_status)

    async def _stream(
        self, request: web.Request, protocol: str, prep: Prepared, msg: Generate, access: AccessRecord
    ) -> web.StreamResponse:
        out = OutputStream(prep.options, tokenizer=prep.tokenizer, control=prep.control)
        try:
            self.pool.pick()  # fail before the 200 goes out when nothing can serve
        except NoInstance as exc:
            return self._error(protocol, 503, str(exc))
        sse = await open_sse(request, self.slow_reader_timeout_s, self._turns)
        access.status = sse.resp.status  # the stream has begun: what a client leaving now saw
        try:
            await self._run(out, msg, sse, access)
        except ClientGone as exc:
            access.finish_reason = "slow_reader" if isinstance(exc, SlowReader) else "client_gone"
            self.metrics.error(access.finish_reason)
            return sse.resp
        finally:
            self.metrics.sse_buffer_peak_bytes = max(self.metrics.sse_buffer_peak_bytes, sse.peak_buffered)
        self.metrics.request_done(protocol, 200)
        await sse.close()
        return sse.resp

    async def _run(
        self, out: OutputStream, msg: Generate, resp: SseStream | None, access: AccessRecord
    ) -> None:
        """Feed every engine step to ``out``; write its SSE pieces when streaming."""
        metrics = self.metrics
        observe_itl, clock, feed = metrics.itl.observe, time.perf_counter, out.feed
        start = last = clock()
        generated = 0
        cached = -1  # none reported yet; every chunk of a run reports the same count
        try:
            async with contextlib.aclosing(self.pool.generate(msg, access.placement)) as chunks:
                async for chunk in chunks:
                    now = clock()
                    if generated:
                        observe_itl(now - last)
                    else:
                        metrics.ttft.observe(now - start)
                        access.first_token = now
                    last = now
                    generated += len(chunk.token_ids)
                    if chunk.cached_tokens != cached:
                        cached = chunk.cached_tokens
                        out.set_cached_tokens(cached)
                    pieces = feed(chunk.token_ids, chunk.logprobs, chunk.top_logprobs)
                    if chunk.finish and not out.done:
                        pieces += out.finish(_engine_finish(chunk.finish))
                    if resp is not None and resp.queue(pieces):
                        await resp.drain()
                    if out.done:
                        break  # closing the stream aborts the request in the engine
        except DsiError as exc:
            if resp is None and isinstance(exc, (NoInstance, InvalidRequest)):
                raise  # answered 503 / 400; a stream already sent its 200 and ends with an error event
            self.metrics.error(exc.code)
            log.warning("request %s failed: %s", msg.request_id, exc)
            pieces = out.finish("error", message=f"generation failed: {exc.code}: {exc.message}")
            if resp is not None and resp.queue(pieces):
                await resp.drain()
        finally:
            metrics.generated_tokens += generated
            metrics.engine_cached_tokens += max(cached, 0)
            access.output_tokens, access.cached_tokens = generated, max(cached, 0)
        if not out.done:
            pieces = out.finish("abort", message="the engine ended the request without a reason")
            if resp is not None and resp.queue(pieces):
                await resp.drain()
        access.finish_reason = out.finish_reason

    def _error(self, protocol: str, status: int, message: str, **extra: str | None) -> web.Response:
        self.metrics.request_done(protocol, status)
        self.metrics.error(f"http_{status}")
        return error_response(protocol, status, message, **extra)


def _answered(access: AccessRecord, resp: web.StreamResponse) -> web.StreamResponse:
    access.status = resp.status
    return resp


def _engine_finish(reason: str) -> str:
    return reason if reason in ("stop", "length", "abort", "error") else "stop"
