"""In-process references to an actor: the same tell / ask / stream as a remote peer, no sockets."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

from dsi.actor.actor import Actor
from dsi.actor.envelope import Envelope
from dsi.errors import AskTimeout, DsiError

_END = object()
_keys = itertools.count(1)


class _FutureChannel:
    __slots__ = ("future", "key")

    def __init__(self) -> None:
        self.key = ("local", next(_keys))
        self.future: asyncio.Future = asyncio.get_running_loop().create_future()

    def reply(self, msg: Any) -> None:
        if not self.future.done():
            self.future.set_result(msg)

    def fail(self, err: DsiError) -> None:
        if not self.future.done():
            self.future.set_exception(err)

    async def item(self, msg: Any) -> None:
        raise TypeError("an ask cannot stream")

    def end(self) -> None:
        self.reply(None)


class _QueueChannel:
    __slots__ = ("closed", "key", "queue")

    def __init__(self, depth: int) -> None:
        self.key = ("local", next(_keys))
        self.queue: asyncio.Queue = asyncio.Queue(depth)
        self.closed = False

    def reply(self, msg: Any) -> None:
        self._close(msg)

    def fail(self, err: DsiError) -> None:
        self._close(err)

    async def item(self, msg: Any) -> None:
        await self.queue.put(msg)

    def end(self) -> None:
        self._close(_END)

    def _close(self, last: Any) -> None:
        if not self.closed:
            self.closed = True
            # The closing marker must get through even when the consumer is slow.
            self.queue._queue.append(last)  # type: ignore[attr-defined]
            self.queue._wakeup_next(self.queue._getters)  # type: ignore[attr-defined]


class LocalRef:
    """tell / ask / stream to an actor living in this event loop."""

    def __init__(self, actor: Actor, stream_depth: int = 64) -> None:
        self.actor = actor
        self._depth = stream_depth

    def tell(self, msg: Any) -> None:
        self.actor.deliver(Envelope(msg))

    async def ask(self, msg: Any, timeout: float | None = 10.0) -> Any:
        channel = _FutureChannel()
        self.actor.deliver(Envelope(msg, channel))
        try:
            return await asyncio.wait_for(channel.future, timeout)
        except TimeoutError:
            self.actor.cancel(channel.key)
            raise AskTimeout(f"{self.actor.name}: no reply to {type(msg).__name__} in {timeout}s") from None

    async def stream(self, msg: Any) -> AsyncIterator[Any]:
        channel = _QueueChannel(self._depth)
        self.actor.deliver(Envelope(msg, channel, stream=True))
        try:
            while True:
                item = await channel.queue.get()
                if item is _END:
                    return
                if isinstance(item, DsiError):
                    raise item
                yield item
        finally:
            if not channel.closed:
                self.actor.cancel(channel.key)
