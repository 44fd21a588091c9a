"""EngineService: an Engine driven from asyncio.

The engine is not thread-safe and its ``step`` blocks, so one task owns it: between steps it
applies queued admissions, aborts and calls, and each step runs, on one dedicated thread; the
event loop only queues work and answers callers. (With async scheduling a step is still in
flight when ``step`` returns, and an export, import or page copy waits for it: on the engine's
thread, never on the loop.) Callers stream a request's outputs with ``generate`` (or
``import_request``); leaving the stream early (a cancelled task, a client that went away)
aborts the request in the engine.

    caller --add--> pending --(between steps)--> engine.add_request --> outputs --> caller's queue
    caller --call(fn)--> calls --(between steps, engine thread)--> fn(engine) --> caller's future
    owner task, after each step and each batch of calls --> EngineLoad --> ``load`` (any reader)

This is the engine's one door: ``shape`` (fixed sizes, an ``EngineShape``), ``load`` (the latest
``EngineLoad``), and the calls below. The engine itself is private; ``call(fn)`` reaches it for
tests and tools, never for roles.

Disaggregation: ``reserve`` / ``release`` hold pages and a slot for an incoming state;
``import_request(state, reservation)`` copies the state into the reserved memory at once (so the
receive buffer may be reused as soon as it returns) and streams the continuation;
``generate(..., prefill_only=True)`` yields the first token, after which ``export`` takes the
request out. ``take_full_pages`` / ``take_ring_snapshots`` drain the engine's FullPage / RingSnapshot
queues from any task.

Live migration: ``full_pages_of`` copies a running request's full pages (pre-copy, while it
keeps decoding); ``export_batch`` takes many running requests out between the same two steps,
each without the pages the receiver already holds, and ends each one's stream with
``RequestMoved`` (the tokens it had not streamed yet are in the exported state's ``output``);
the receiver grows and fills a reservation (``grow_reservation``, ``write_pages``) and imports
with ``held`` pages.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from dsi.engine.engine import Engine, EngineConfig, RequestOutput
from dsi.engine.experts import ExpertLayer
from dsi.engine.gather import gather_delay
from dsi.engine.images import ImageEmbeds
from dsi.engine.load import EngineLoad
from dsi.engine.params import SamplingParams
from dsi.engine.prefix import CachedPrefix, FullPage, RequestStats, RingSnapshot
from dsi.engine.shape import EngineShape
from dsi.engine.transfer import RequestState, Reservation
from dsi.errors import ActorStopped, DsiError
from dsi.model.config import ModelConfig

log = logging.getLogger(__name__)
T = TypeVar("T")


class RequestMoved(DsiError):
    """Ends the stream of a request that ``export_batch`` took out of this engine (in process only)."""

    code = "request_moved"


@dataclass(slots=True)
class _Pending:
    request_id: str
    admit: Callable[[Engine], None]  # adds the request to the engine; raises DsiError to refuse
    admitted: asyncio.Future
    outputs: asyncio.Queue
    at: float = 0.0  # when it arrived (time.monotonic)


@dataclass(slots=True)
class _Call:
    fn: Callable[[Engine], Any]  # runs on the engine's thread
    future: asyncio.Future
    settle: Callable[[Any], None] | None = None  # on the loop, with fn's result, before the caller has it


def step_thread() -> ThreadPoolExecutor:
    """The one thread an engine is built and stepped on.

    One thread for both, because of how libgomp (torch's OpenMP on Linux) waits: every thread
    that runs a parallel region keeps a team of worker threads, and once a process holds more
    OpenMP threads than it has CPUs, every team's workers spin only 100 times before they sleep
    at a barrier. An engine built on one thread (weights loaded and packed: parallel regions)
    and stepped on another held two teams, and its forwards ran as if every wait slept: a
    2,060-token prefill of the tiny model took 0.50 s instead of 0.25 s on 2 cores."""
    return ThreadPoolExecutor(1, thread_name_prefix="dsi-engine-step")


class EngineService:
    keep_stats = 1024  # streams whose final stats request_stats remembers

    def __init__(
        self, engine: Engine, thread: ThreadPoolExecutor | None = None, gather_s: float = 0.0
    ) -> None:
        """``thread``: the executor that steps the engine (:func:`step_thread`); best the one that
        built it. ``gather_s``: the quiet time that ends a burst of arrivals at an idle engine,
        whose first step waits for it (:mod:`dsi.engine.gather`; 0: never waits)."""
        self._engine = engine
        self.shape: EngineShape = engine.shape
        self._load = engine.load()
        self._pending: list[_Pending] = []
        self._calls: list[_Call] = []
        self._aborts: list[str] = []
        self._streams: dict[str, asyncio.Queue] = {}
        self._wake = asyncio.Event()
        self._thread = thread or step_thread()
        self._task: asyncio.Task | None = None
        self._final_stats: dict[str, RequestStats] = {}  # request id -> stats at its final output
        self.steps = 0
        self.gather_s = gather_s
        self.gathers = 0  # first steps held for a burst
        self._fresh: list[float] = []  # arrivals admitted since the last step
        self._before: float | None = None  # the arrival before them
        self._busy = False  # the last step left requests unfinished
        self._held = False  # the coming step was held for a burst
        # Called on the event loop after a step that finished a request, before its final output
        # reaches its reader: the host takes the request's ring snapshot and pages at once.
        self.on_finished: Callable[[], None] | None = None

    @classmethod
    def create(
        cls,
        model: ModelConfig,
        weights: dict[str, torch.Tensor],
        config: EngineConfig,
        experts: ExpertLayer | None = None,
        draft: dict[str, torch.Tensor] | None = None,
        thread: ThreadPoolExecutor | None = None,
        gather_s: float = 0.0,
    ) -> EngineService:
        """Build the engine and its service (blocking: allocates the pools, measures the step-time
        curve of a dspark engine; run it off the event loop, in ``thread``, the :func:`step_thread`
        that will step it). ``experts``: an expert-parallel MoE the engine uses and closes;
        ``draft``: speculative decoding's; ``gather_s``: see ``__init__``."""
        return cls(Engine(model, weights, config, experts, draft), thread, gather_s)

    @property
    def running(self) -> int:
        """Streams open on this service."""
        return len(self._streams)

    @property
    def load(self) -> EngineLoad:
        """The engine's load as of the last step (or admission, abort, call)."""
        return self._load

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="engine-service")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        stopped = ActorStopped("the engine is shutting down")
        for p in self._pending:
            if not p.admitted.done():
                p.admitted.set_exception(stopped)
        for c in self._calls:
            if not c.future.done():
                c.future.set_exception(stopped)
        self._calls.clear()
        for queue in self._streams.values():
            queue.put_nowait(stopped)
        self._streams.clear()
        await asyncio.get_running_loop().run_in_executor(self._thread, self._engine.close)
        self._thread.shutdown(wait=True)

    def generate(
        self,
        request_id: str,
        prompt: list[int],
        params: SamplingParams,
        prefill_only: bool = False,
        cached: CachedPrefix | None = None,
        images: Sequence[ImageEmbeds] = (),
    ) -> AsyncIterator[RequestOutput]:
        """Outputs of one request until it finishes; raises InvalidRequest if it is refused.
        ``cached`` pages must stay valid until the stream ends (the engine reads them again
        after a preemption); so must ``images`` (image embeddings, dsi.engine.images)."""
        return self._stream(
            request_id, lambda e: e.add_request(request_id, prompt, params, prefill_only, cached, images)
        )

    def import_request(
        self, state: RequestState, reservation: Reservation | None = None, held: int = 0
    ) -> AsyncIterator[RequestOutput]:
        """Continue an exported request here; streams like ``generate``. With a reservation the
        state's buffers are copied into it before this returns (InvalidRequest on a mismatch),
        and a refused import releases it; without one the buffers are read when the engine
        admits the request (keep them until the first output). ``held``: leading pages already
        in the reservation (pre-copied with ``write_pages``)."""
        if reservation is not None:
            self._engine.write_reservation(
                state, reservation, held
            )  # reserved memory: safe while a step runs

        def admit(engine: Engine) -> None:
            try:
                engine.import_request(state, reservation, held)
            except DsiError:
                if reservation is not None:
                    engine.release(reservation)
                raise

        return self._stream(state.request_id, admit)

    async def call(self, fn: Callable[[Engine], T]) -> T:
        """Run ``fn(engine)`` between two steps, on the engine's thread, and return its result
        (or raise its error). For tests and tools: roles use the named calls."""
        return await self._call(fn)

    async def _call(self, fn: Callable[[Engine], T], settle: Callable[[T], None] | None = None) -> T:
        if self._task is None:
            raise ActorStopped("the engine service is not running")
        future = asyncio.get_running_loop().create_future()
        self._calls.append(_Call(fn, future, settle))
        self._wake.set()
        return await future

    async def reserve(self, num_blocks: int) -> Reservation:
        return await self.call(lambda e: e.reserve(num_blocks))

    async def release(self, reservation: Reservation) -> None:
        await self.call(lambda e: e.release(reservation))

    async def export(self, request_id: str, hold: bool = False) -> RequestState:
        """Take a (prefilled or running) request out of the engine with its cache. ``hold``: its
        pages stay in the engine's pool, viewed by the state, until ``release_held(state.held)``
        (no copy; see ``Engine.export_request``)."""
        return await self.call(lambda e: e.export_request(request_id, hold=hold))

    async def release_held(self, pages: tuple[int, ...]) -> None:
        """Give back the pages of a held export once its bytes are sent."""
        if pages:
            await self.call(lambda e: e.release_held(pages))

    async def export_batch(self, skips: dict[str, int]) -> dict[str, RequestState | DsiError]:
        """Take running requests out between the same two steps: request id -> its state without
        its first ``skips[id]`` pages, or the error that kept it here. Each exported request's
        stream ends with ``RequestMoved``."""

        def take(engine: Engine) -> dict[str, RequestState | DsiError]:
            out: dict[str, RequestState | DsiError] = {}
            for request_id, skip in skips.items():
                try:
                    out[request_id] = engine.export_request(request_id, skip)
                except DsiError as exc:
                    out[request_id] = exc
            return out

        def end_streams(out: dict[str, RequestState | DsiError]) -> None:
            # before the next step: its outputs for these requests are in their states already
            for request_id, state in out.items():
                queue = self._streams.pop(request_id, None) if isinstance(state, RequestState) else None
                if queue is not None:
                    queue.put_nowait(RequestMoved(f"request {request_id!r} moved to another instance"))

        return await self._call(take, end_streams)

    async def full_pages_of(self, request_id: str, start: int) -> torch.Tensor:
        """A copy of a running request's full pages from ``start`` on (``[m, page_elems]`` fp32)."""
        return await self.call(lambda e: e.full_pages_of(request_id, start))

    async def grow_reservation(self, reservation: Reservation, num_blocks: int) -> None:
        await self.call(lambda e: e.grow_reservation(reservation, num_blocks))

    def write_pages(self, reservation: Reservation, start: int, pages: torch.Tensor) -> None:
        """Copy pre-copied full pages into a reservation (reserved memory: safe while a step runs)."""
        self._engine.write_pages(reservation, start, pages)

    def request_stats(self, request_id: str) -> RequestStats | None:
        """What a request cost, as of the final output of its stream (a prefill-only request's
        "prefilled" one included); None unless one of the last ``keep_stats`` streams that ended here."""
        return self._final_stats.get(request_id)

    def take_full_pages(self) -> list[FullPage]:
        return self._engine.take_full_pages()

    def take_ring_snapshots(self) -> list[RingSnapshot]:
        return self._engine.take_ring_snapshots()

    async def _stream(self, request_id: str, admit: Callable[[Engine], None]) -> AsyncIterator[RequestOutput]:
        if self._task is None:
            raise ActorStopped("the engine service is not running")
        loop = asyncio.get_running_loop()
        pending = _Pending(request_id, admit, loop.create_future(), asyncio.Queue(), time.monotonic())
        self._pending.append(pending)
        self._wake.set()
        finished = False
        try:
            # A caller cancelled here may find the request admitted already (the result was set
            # before the cancellation landed): the finally below aborts it then.
            await pending.admitted
            while True:
                out = await pending.outputs.get()
                if isinstance(out, DsiError):
                    raise out
                finished = out.finished
                yield out
                if finished:
                    return
        finally:
            admitted = pending.admitted
            if not finished and admitted.done() and not admitted.cancelled() and admitted.exception() is None:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        self._aborts.append(request_id)
        self._wake.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._apply()
            self._load = self._engine.load()
            if not (self._engine.has_unfinished() or self._calls or self._pending or self._aborts):
                self._wake.clear()
                await self._wake.wait()
                continue
            hold = (
                0.0
                if self._busy
                else gather_delay(time.monotonic(), self._fresh, self._before, self.gather_s)
            )
            if hold > 0:  # a burst is arriving at an idle engine: one first step for all of it
                self._wake.clear()
                self._held = True
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), hold)
                continue
            try:
                outputs = await loop.run_in_executor(self._thread, self._engine.step)
            except Exception:  # a failing step must not leave callers waiting forever
                log.exception("engine step failed; failing the running requests")
                self._fail_all(DsiError("engine step failed"))
                continue
            self.steps += 1
            if self._held:
                self.gathers, self._held = self.gathers + 1, False
            if self._fresh:
                self._before, self._fresh = self._fresh[-1], []
            self._busy = self._engine.has_unfinished()
            self._load = self._engine.load()  # before the outputs wake their readers
            if self.on_finished is not None and any(out.finished for out in outputs):
                try:
                    self.on_finished()
                except Exception:  # the host's hook must not stop the engine
                    log.exception("on_finished hook failed")
            for out in outputs:
                queue = self._streams.get(out.request_id)
                if queue is not None:
                    if out.finished:
                        del self._streams[out.request_id]
                        self._keep_stats(out.request_id)
                    queue.put_nowait(out)

    async def _apply(self) -> None:
        """Queued admissions, aborts and calls, run on the engine's thread; their callers are
        answered here, on the loop."""
        pending = [p for p in self._pending if not p.admitted.done()]  # else the caller went away
        calls = [c for c in self._calls if not c.future.done()]
        aborts, self._pending, self._calls, self._aborts = self._aborts, [], [], []
        if not (pending or aborts or calls):
            return
        loop = asyncio.get_running_loop()
        try:
            refusals, results = await loop.run_in_executor(
                self._thread, self._on_engine, pending, aborts, calls
            )
        except asyncio.CancelledError:  # closing: close() answers only what is still queued
            stopped = ActorStopped("the engine is shutting down")
            for future in [p.admitted for p in pending] + [c.future for c in calls]:
                if not future.done():
                    future.set_exception(stopped)
            raise
        for p, refusal in zip(pending, refusals, strict=True):
            if refusal is None and p.admitted.done():  # admitted after its caller went away
                self._aborts.append(p.request_id)
            elif refusal is None:
                self._streams[p.request_id] = p.outputs
                self._fresh.append(p.at)
                p.admitted.set_result(None)
            elif not p.admitted.done():
                p.admitted.set_exception(refusal)
        for c, (ok, value) in zip(calls, results, strict=True):
            if ok and c.settle is not None:
                c.settle(value)
            if c.future.done():
                continue
            if ok:
                c.future.set_result(value)
            else:
                c.future.set_exception(value)

    def _on_engine(
        self, pending: list[_Pending], aborts: list[str], calls: list[_Call]
    ) -> tuple[list[Exception | None], list[tuple[bool, Any]]]:
        """The engine's thread: admit, abort, call in turn. Returns each admission's refusal
        (None: admitted) and each call's (succeeded, result or error)."""
        refusals: list[Exception | None] = []
        for p in pending:
            try:
                p.admit(self._engine)
                refusals.append(None)
            except Exception as exc:  # the caller gets the error; the engine goes on
                refusals.append(exc)
        for request_id in aborts:
            self._engine.abort(request_id)
        results: list[tuple[bool, Any]] = []
        for c in calls:
            try:
                results.append((True, c.fn(self._engine)))
            except Exception as exc:  # the caller gets the error; the engine goes on
                results.append((False, exc))
        return refusals, results

    def _keep_stats(self, request_id: str) -> None:
        stats = self._engine.request_stats(request_id)
        if stats is None:
            return
        self._final_stats.pop(request_id, None)
        self._final_stats[request_id] = stats
        while len(self._final_stats) > self.keep_stats:
            del self._final_stats[next(iter(self._final_stats))]

    def _fail_all(self, err: DsiError) -> None:
        for request_id, queue in list(self._streams.items()):
            queue.put_nowait(err)
            self._aborts.append(request_id)  # applied on the engine's thread before the next step
        self._streams.clear()
