"""Actor: an inbox, a single-threaded handler loop, lifecycle hooks.

Handlers are methods marked with :func:`handles`; the message class is the annotation of their
only argument. A handler returns the reply (``None`` means ``Ack``) or, when it is an ``async``
generator, streams items back. Lifecycle::

    start() -> on_start() -> loop: inbox -> handler -> reply ... stop() -> on_stop()

A handler that raises answers its caller with a typed error (``HandlerError`` unless it raised a
``DsiError``) and calls ``on_failure``; the actor keeps serving. On stop, every queued message
and every running stream or concurrent call is answered with ``ActorStopped``, so no caller hangs.

Handlers may be plain functions (``def``) when they never wait: a message for such a handler
that arrives while the actor is idle (nothing queued, no handler running) is handled at once
by the I/O bridge, without a trip through the inbox - same order, same single thread, one
event-loop wake-up less per call.

Backpressure: the inbox holds at most ``inbox_limit`` messages. ``deliver`` never blocks: when
the inbox is full it answers the call with ``Overloaded`` at once (a tell is dropped and counted
in ``dropped``), so a slow actor sheds load to its callers instead of stalling its socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dsi.actor.envelope import Envelope
from dsi.errors import ActorStopped, DsiError, HandlerError, Overloaded, UnknownMessage
from dsi.messages.base import Ack

log = logging.getLogger(__name__)

_HANDLER_ATTR = "__dsi_handles__"


def handles(fn: Callable | None = None, *, concurrent: bool = False) -> Any:
    """Mark a method as the handler of the message class its argument is annotated with.

    ``concurrent=True`` runs each call as its own task (for handlers that await I/O), so the
    loop goes on with the next message; plain handlers run one at a time, in order.
    """

    def mark(f: Callable) -> Callable:
        setattr(f, _HANDLER_ATTR, concurrent)
        return f

    return mark(fn) if fn is not None else mark


class Actor:
    """Base class for every role. Subclasses define handlers and the lifecycle hooks."""

    inbox_limit: int = 4096
    max_concurrent: int = 256

    def __init__(self, name: str) -> None:
        self.name = name
        self.dropped = 0
        self.handled = 0
        self.failures = 0
        self._inbox: asyncio.Queue[Envelope] = asyncio.Queue(self.inbox_limit)
        self._loop_task: asyncio.Task | None = None
        self._tasks: dict[Any, asyncio.Task] = {}
        self._background: set[asyncio.Task] = set()
        self._handlers = _collect_handlers(self)
        self._running = False
        self._busy = False  # the loop is inside an async handler

    # ---- lifecycle hooks -------------------------------------------------------------------
    async def on_start(self) -> None:
        """Runs before the first message."""

    async def on_stop(self) -> None:
        """Runs after the last message; release resources here."""

    async def on_failure(self, exc: BaseException, msg: Any) -> None:
        """A handler raised ``exc`` while handling ``msg``; the caller already got the error."""
        log.warning("%s: handler for %s failed: %r", self.name, type(msg).__name__, exc)

    # ---- public ------------------------------------------------------------------------------
    @property
    def message_types(self) -> tuple[type, ...]:
        return tuple(self._handlers)

    @property
    def running(self) -> bool:
        return self._running

    @property
    def inbox_depth(self) -> int:
        return self._inbox.qsize()

    async def start(self) -> None:
        await self.on_start()
        self._running = True
        self._loop_task = asyncio.get_running_loop().create_task(self._loop(), name=f"{self.name}.loop")

    async def stop(self) -> None:
        """Stop handling; answer everything queued or running with ActorStopped; on_stop."""
        if not self._running:
            return
        self._running = False
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        stopped = ActorStopped(f"{self.name} is stopping")
        while not self._inbox.empty():
            env = self._inbox.get_nowait()
            if env.channel is not None:
                env.channel.fail(stopped)
        tasks = [*self._tasks.values(), *self._background]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.on_stop()

    def deliver(self, env: Envelope) -> bool:
        """Queue a message; answers at once (and returns False) when stopped or full."""
        if not self._running:
            if env.channel is not None:
                env.channel.fail(ActorStopped(f"{self.name} is not running"))
            return False
        if not self._busy and self._inbox.empty():
            entry = self._handlers.get(type(env.msg))
            if entry is not None and entry.sync and not env.stream:
                self._call_sync(entry.fn, env)
                return True
        try:
            self._inbox.put_nowait(env)
        except asyncio.QueueFull:
            self.dropped += env.channel is None
            if env.channel is not None:
                env.channel.fail(Overloaded(f"{self.name}: inbox full ({self.inbox_limit} messages)"))
            return False
        return True

    def cancel(self, key: Any) -> bool:
        """Cancel a running stream or concurrent call by its channel key."""
        task = self._tasks.get(key)
        if task is None:
            return False
        task.cancel()
        return True

    def spawn(self, coro: Any, name: str | None = None) -> asyncio.Task:
        """Run a background task owned by the actor (cancelled on stop)."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    # ---- internals ---------------------------------------------------------------------------
    async def _loop(self) -> None:
        while True:
            env = await self._inbox.get()
            entry = self._handlers.get(type(env.msg))
            if entry is None:
                if env.channel is not None:
                    env.channel.fail(
                        UnknownMessage(f"{self.name} has no handler for {type(env.msg).__name__}")
                    )
                continue
            if env.channel is not None and env.stream != entry.streams:
                how = (
                    "streams: call it with stream()" if entry.streams else "answers once: call it with ask()"
                )
                env.channel.fail(UnknownMessage(f"{self.name}: {type(env.msg).__name__} {how}"))
                continue
            if entry.sync:
                self._call_sync(entry.fn, env)
            elif entry.concurrent or entry.streams:
                if len(self._tasks) >= self.max_concurrent and env.channel is not None:
                    env.channel.fail(Overloaded(f"{self.name}: {self.max_concurrent} calls running"))
                    continue
                self._track(env, self._run_task(entry, env))
            else:
                self._busy = True
                try:
                    await self._run(entry.fn, env)
                except asyncio.CancelledError:  # stop() while this handler ran
                    self._answer_error(env, ActorStopped(f"{self.name} is stopping"))
                    raise
                finally:
                    self._busy = False

    def _call_sync(self, handler: Callable, env: Envelope) -> None:
        try:
            result = handler(env.msg)
        except Exception as exc:
            if self._failed(env, exc):
                self.spawn(self.on_failure(exc, env.msg))
        else:
            self._succeeded(env, result)

    def _track(self, env: Envelope, coro: Any) -> None:
        key = env.channel.key if env.channel is not None else object()
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks[key] = task
        task.add_done_callback(lambda _t, k=key: self._tasks.pop(k, None))

    async def _run(self, handler: Callable, env: Envelope) -> None:
        try:
            result = await handler(env.msg)
        except Exception as exc:
            if self._failed(env, exc):
                await self.on_failure(exc, env.msg)
        else:
            self._succeeded(env, result)

    async def _run_task(self, entry: _Handler, env: Envelope) -> None:
        try:
            if entry.streams:
                await self._stream(entry.fn, env)
            else:
                await self._run(entry.fn, env)
        except asyncio.CancelledError:
            if env.channel is not None:
                reason = "stopping" if not self._running else "call cancelled"
                env.channel.fail(ActorStopped(f"{self.name}: {reason}"))
            raise

    async def _stream(self, handler: Callable, env: Envelope) -> None:
        try:
            # aclosing: a cancelled stream runs the handler's own cleanup (finally blocks) now,
            # not whenever the garbage collector finalizes the generator
            async with contextlib.aclosing(handler(env.msg)) as items:
                async for item in items:
                    if env.channel is not None:
                        await env.channel.item(item)
        except Exception as exc:
            if self._failed(env, exc):
                await self.on_failure(exc, env.msg)
        else:
            self.handled += 1
            if env.channel is not None:
                env.channel.end()

    def _succeeded(self, env: Envelope, result: Any) -> None:
        self.handled += 1
        if env.channel is not None:
            env.channel.reply(Ack() if result is None else result)

    def _failed(self, env: Envelope, exc: Exception) -> bool:
        """Answer the caller; True when the failure is the handler's own (not a typed error)."""
        if isinstance(exc, DsiError):
            self._answer_error(env, exc)
            return False
        self._answer_error(env, HandlerError(f"{type(exc).__name__}: {exc}"))
        self.failures += 1
        return True

    @staticmethod
    def _answer_error(env: Envelope, exc: DsiError) -> None:
        if env.channel is not None:
            env.channel.fail(exc)


@dataclass(slots=True, frozen=True)
class _Handler:
    fn: Callable
    concurrent: bool  # runs as its own task
    streams: bool  # an async generator: items, then END
    sync: bool  # a plain function: may run inline when the actor is idle


def _collect_handlers(actor: Actor) -> dict[type, _Handler]:
    handlers: dict[type, _Handler] = {}
    for klass in reversed(type(actor).__mro__):
        for attr, fn in vars(klass).items():
            if not hasattr(fn, _HANDLER_ATTR):
                continue
            hints = typing.get_type_hints(fn)
            params = [p for p in inspect.signature(fn).parameters if p != "self"]
            if len(params) != 1 or params[0] not in hints:
                raise TypeError(f"{klass.__name__}.{attr}: a handler takes one annotated message argument")
            concurrent = getattr(fn, _HANDLER_ATTR)
            streams = inspect.isasyncgenfunction(fn)
            sync = not streams and not inspect.iscoroutinefunction(fn)
            if sync and concurrent:
                raise TypeError(f"{klass.__name__}.{attr}: a plain function cannot run concurrently")
            handlers[hints[params[0]]] = _Handler(getattr(actor, attr), concurrent, streams, sync)
    return handlers
