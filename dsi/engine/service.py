"""EngineService: an Engine driven from asyncio.

The engine is not thread-safe and its ``step`` blocks, so one task owns it: between steps (on the
event loop) it applies queued adds and aborts; each step runs on a dedicated thread. Callers
stream a request's outputs with ``generate``; leaving the stream early (a cancelled task, a
client that went away) aborts the request in the engine.

    caller --add--> pending --(between steps)--> engine.add_request --> outputs --> caller's queue
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from dsi.engine.engine import Engine, RequestOutput
from dsi.engine.params import SamplingParams
from dsi.errors import ActorStopped, DsiError

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Pending:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    admitted: asyncio.Future
    outputs: asyncio.Queue


class EngineService:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._pending: list[_Pending] = []
        self._aborts: list[str] = []
        self._streams: dict[str, asyncio.Queue] = {}
        self._wake = asyncio.Event()
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="dsi-engine-step")
        self._task: asyncio.Task | None = None
        self.steps = 0

    @property
    def running(self) -> int:
        return len(self._streams)

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
        for queue in self._streams.values():
            queue.put_nowait(stopped)
        self._streams.clear()
        await asyncio.get_running_loop().run_in_executor(self._thread, self.engine.close)
        self._thread.shutdown(wait=True)

    async def generate(self, request_id: str, prompt: list[int], params: SamplingParams
                       ) -> AsyncIterator[RequestOutput]:
        """Outputs of one request until it finishes; raises InvalidRequest if it is refused."""
        if self._task is None:
            raise ActorStopped("the engine service is not running")
        loop = asyncio.get_running_loop()
        pending = _Pending(request_id, prompt, params, loop.create_future(), asyncio.Queue())
        self._pending.append(pending)
        self._wake.set()
        await pending.admitted
        finished = False
        try:
            while True:
                out = await pending.outputs.get()
                if isinstance(out, DsiError):
                    raise out
                finished = out.finished
                yield out
                if finished:
                    return
        finally:
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        self._aborts.append(request_id)
        self._wake.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._apply()
            if not self.engine.has_unfinished():
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                outputs = await loop.run_in_executor(self._thread, self.engine.step)
            except Exception:  # a failing step must not leave callers waiting forever
                log.exception("engine step failed; failing the running requests")
                self._fail_all(DsiError("engine step failed"))
                continue
            self.steps += 1
            for out in outputs:
                queue = self._streams.get(out.request_id)
                if queue is not None:
                    queue.put_nowait(out)
                    if out.finished:
                        del self._streams[out.request_id]

    def _apply(self) -> None:
        pending, self._pending = self._pending, []
        for p in pending:
            if p.admitted.done():  # the caller went away before admission
                continue
            try:
                self.engine.add_request(p.request_id, p.prompt, p.params)
            except DsiError as exc:
                p.admitted.set_exception(exc)
                continue
            self._streams[p.request_id] = p.outputs
            p.admitted.set_result(None)
        aborts, self._aborts = self._aborts, []
        for request_id in aborts:
            self.engine.abort(request_id)

    def _fail_all(self, err: DsiError) -> None:
        for request_id, queue in list(self._streams.items()):
            queue.put_nowait(err)
            self.engine.abort(request_id)
        self._streams.clear()
