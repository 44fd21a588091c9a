"""StalledPeers: what a ROUTER sends to a peer whose queue is full waits, in order, for a bound.

A plain ROUTER drops a message for a peer whose queue holds ``HWM`` messages, and says nothing.
With ``ZMQ_ROUTER_MANDATORY`` the send fails instead: EAGAIN for a full queue, EHOSTUNREACH
for a peer that is gone. This keeps the messages of a full peer here, per peer and in order,
retried every ``retry_s`` until the peer reads again; the other peers are not held up::

    send --> peer queue has room ------------------------------> sent
         \\-> full (EAGAIN) --> waits here ---(room)-----------> sent, in order
                                          \\--(limit_s passes)--> dropped["full"] + a warning
         \\-> peer gone (EHOSTUNREACH) ------------------------> dropped["gone"]

``wait(peer, timeout_s)`` lets a producer (a stream) pause while its peer is stalled, so a stream
is paced by its reader instead of outrunning it. Nothing is dropped without being counted:
``dropped`` by reason, ``stalls`` the times a peer's queue was found full.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import logging
import time
from collections.abc import Callable
from typing import Any

import zmq

log = logging.getLogger(__name__)


class StalledPeers:
    """``send_now(frames)``: one non-blocking send of ``[routing id, *frames]`` (raises zmq.Again
    when the peer's queue is full); ``limit_s``: seconds a stalled peer's messages wait before
    they are dropped; ``retry_s``: seconds between two tries."""

    def __init__(
        self,
        send_now: Callable[[list[Any]], None],
        name: str = "",
        limit_s: float = 30.0,
        retry_s: float = 0.005,
    ) -> None:
        self.name = name
        self.limit_s, self.retry_s = limit_s, retry_s
        self.dropped: collections.Counter[str] = collections.Counter()  # messages, by reason
        self.stalls = 0  # times a peer's queue was found full
        self._send_now = send_now
        self._queues: dict[bytes, collections.deque[list[Any]]] = {}
        self._since: dict[bytes, float] = {}  # monotonic seconds since the peer stalled
        self._moving: dict[bytes, asyncio.Event] = {}  # set once the peer is no longer stalled
        self._timer: asyncio.TimerHandle | None = None

    def send(self, frames: list[Any]) -> None:
        """Send now, or queue behind the peer's stalled messages; never blocks."""
        key = frames[0]
        queue = self._queues.get(key)
        if queue is not None:
            queue.append(frames)
            return
        try:
            self._send_now(frames)
        except zmq.Again:
            self.stalls += 1
            self._queues[key] = collections.deque([frames])
            self._since[key] = time.monotonic()
            self._moving[key] = asyncio.Event()
            self._arm()
        except zmq.ZMQError as exc:
            if exc.errno != errno.EHOSTUNREACH:
                raise
            self.dropped["gone"] += 1
            log.debug("%s: dropped a message to a gone peer", self.name)

    def stalled(self, key: bytes) -> bool:
        return key in self._queues

    @property
    def waiting(self) -> int:
        """Messages held for stalled peers now."""
        return sum(len(q) for q in self._queues.values())

    async def wait(self, key: bytes, timeout_s: float) -> bool:
        """Until peer ``key`` is not stalled (True), or ``timeout_s`` passed (False)."""
        moving = self._moving.get(key)
        if moving is None:
            return True
        try:
            await asyncio.wait_for(moving.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        """Forget what is held (counted as dropped) and wake every waiter."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for key in list(self._queues):
            self._drop(key, "closed")

    # ---- internals ---------------------------------------------------------------------------
    def _arm(self) -> None:
        if self._timer is None and self._queues:
            self._timer = asyncio.get_running_loop().call_later(self.retry_s, self._retry)

    def _retry(self) -> None:
        self._timer = None
        now = time.monotonic()
        for key in list(self._queues):
            if self._flush(key):
                continue
            if now - self._since[key] >= self.limit_s:
                held = self._drop(key, "full")
                log.warning(
                    "%s: dropped %d messages to a peer that read nothing for %gs (its queue is full)",
                    self.name,
                    held,
                    self.limit_s,
                )
        self._arm()

    def _flush(self, key: bytes) -> bool:
        """Send the peer's held messages in order while it takes them; True once none is left."""
        queue = self._queues[key]
        while queue:
            try:
                self._send_now(queue[0])
            except zmq.Again:
                return False
            except zmq.ZMQError as exc:
                if exc.errno != errno.EHOSTUNREACH:
                    raise
                self._drop(key, "gone")
                return True
            queue.popleft()
        self._release(key)
        return True

    def _drop(self, key: bytes, reason: str) -> int:
        held = len(self._queues[key])
        self.dropped[reason] += held
        self._release(key)
        return held

    def _release(self, key: bytes) -> None:
        del self._queues[key], self._since[key]
        self._moving.pop(key).set()
