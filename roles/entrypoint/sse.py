"""Server-sent events out of an aiohttp handler; a client that went away, or stopped reading,
ends the stream.

Writes are coalesced: ``queue`` adds one engine step's events to the stream's pending bytes,
and the first step queued in a turn of the event loop puts the stream on its gateway's
``TurnWrites``, which writes every stream put there at the end of that turn (one callback per
turn for all of them). Steps that arrive together (several engine steps read off a socket at once) thus leave
in one write, one HTTP chunk, one system call; a lone step leaves at the end of the turn it
arrived in, as before. The bytes the client reads are the same.

What one stream can hold in the gateway while its client does not read::

    engine step --SseStream.queue--> pending bytes --end of turn--> transport buffer --> client
                   |                                                  pauses the protocol above
                   |                                                  its high-water mark (64 KiB)
                   \\-- when the transport's buffer plus the pending bytes pass the high-water
                       mark, ``queue`` says so and the gateway ``drain``s before it pulls the
                       next step: the pending bytes are written and it waits while the protocol
                       is paused; a wait of ``stall_timeout_s`` ends the stream (``SlowReader``):
                       the connection is aborted and the upstream stream closed (CANCEL)

so a stream buffers at most about 64 KiB plus one step's events in the transport, and the
engine steps that arrive during one stall (at most ``stall_timeout_s`` of them) in its
upstream queue.

The first write of a stream and the last (with the end of the stream) go through aiohttp's
writer; the writes between frame their HTTP/1.1 chunk themselves. The response headers leave
with the first write (one system call, one segment for both), or on their own once
``HEADERS_WAIT_S`` passed without an event, so a client of a long prefill still sees the status
at once.
"""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter

SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


HEADERS_WAIT_S = 0.1  # the longest the headers wait for the first event (seconds)


class ClientGone(Exception):
    """The HTTP client closed the connection mid-stream."""


class SlowReader(ClientGone):
    """The HTTP client read nothing for the stall timeout; the connection was aborted."""


class TurnWrites:
    """The streams with bytes queued in this turn of the event loop, written by one callback
    at its end. One per gateway; a gateway used from another loop (tests) starts afresh."""

    __slots__ = ("_due", "_loop")

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._due: list[SseStream] = []

    def add(self, stream: SseStream, loop: asyncio.AbstractEventLoop) -> None:
        if loop is not self._loop:
            self._loop, self._due = loop, []
        if not self._due:
            loop.call_soon(self._write)
        self._due.append(stream)

    def _write(self) -> None:
        due, self._due = self._due, []
        for stream in due:
            stream._flush()


class SseStream:
    """One streamed response: ``queue`` each engine step's events, ``drain`` when it asks to,
    ``close`` at the end.

    ``writer``: the prepared response's payload writer (the request's ``writer``); ``turns``:
    where its end-of-turn writes are scheduled (None: a ``TurnWrites`` of its own).
    ``peak_buffered``: the most bytes the transport held unsent when a step was queued past
    the high-water mark (bytes).
    """

    __slots__ = (
        "_chunked",
        "_high",
        "_loop",
        "_pending",
        "_pending_bytes",
        "_started",
        "_transport",
        "_turns",
        "_writer",
        "peak_buffered",
        "resp",
        "stall_timeout_s",
    )

    def __init__(
        self,
        resp: web.StreamResponse,
        writer: AbstractStreamWriter,
        transport: asyncio.Transport | None,
        stall_timeout_s: float,
        turns: TurnWrites | None = None,
    ) -> None:
        self.resp = resp
        self._turns = turns if turns is not None else TurnWrites()
        self.stall_timeout_s = stall_timeout_s
        self.peak_buffered = 0
        self._writer = writer
        self._chunked = bool(getattr(writer, "chunked", False))  # HTTP/1.0 clients get the bytes as they are
        self._transport = transport  # None: the client left before the stream began
        self._high = transport.get_write_buffer_limits()[1] if transport is not None else 0
        self._loop = asyncio.get_running_loop()
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._started = False  # the first write, with the headers, went out

    def queue(self, pieces: list[str]) -> bool:
        """Add one step's events to this turn's write; raises ClientGone. True: ``await drain()``
        before the next step (the client is behind, or the stream's first write is due)."""
        if not pieces:
            return False
        transport = self._transport
        if transport is None or transport.is_closing():
            raise ClientGone("the client closed the connection")
        data = (pieces[0] if len(pieces) == 1 else "".join(pieces)).encode()
        if not self._started:
            self._pending.append(data)
            return True
        if not self._pending:
            self._turns.add(self, self._loop)
        self._pending.append(data)
        self._pending_bytes += len(data)
        buffered = transport.get_write_buffer_size()
        if buffered + self._pending_bytes <= self._high:
            return False  # the client keeps up
        self.peak_buffered = max(self.peak_buffered, buffered)
        return True

    async def drain(self) -> None:
        """Write what is pending now, and wait while the client is behind; raises ClientGone,
        or SlowReader after ``stall_timeout_s``."""
        transport = self._transport
        if transport is None:
            raise ClientGone("the client closed the connection before the stream began")
        try:
            async with asyncio.timeout(self.stall_timeout_s):
                if not self._started:
                    data = b"".join(self._pending)
                    self._pending.clear()
                    self._started = True
                    await self._writer.write(data)
                else:
                    self._flush()
                    await self._writer.drain()
        except TimeoutError:
            transport.abort()
            raise SlowReader(f"the client read nothing for {self.stall_timeout_s:g}s") from None
        except (ConnectionError, RuntimeError) as exc:
            raise ClientGone(str(exc)) from None

    async def close(self) -> None:
        """Write what is pending and the end of the stream, in one write (a client that left is
        no error)."""
        data = b"".join(self._pending)
        self._pending.clear()
        self._pending_bytes = 0
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self.resp.write_eof(data)

    def _flush(self) -> None:
        pending = self._pending
        if not pending:
            return  # drained or closed since this write was scheduled
        data = pending[0] if len(pending) == 1 else b"".join(pending)
        pending.clear()
        self._pending_bytes = 0
        transport = self._transport
        if transport is None or transport.is_closing():
            return  # the next queue raises ClientGone
        transport.write(b"%x\r\n%b\r\n" % (len(data), data) if self._chunked else data)


class _SseResponse(web.StreamResponse):
    # aiohttp (3.12 on) keeps the headers until the first write, or sends them on send_headers().
    _send_headers_immediately = False


def _send_headers(writer: AbstractStreamWriter) -> None:
    """The headers now, unless they left with an event (a client gone meanwhile is no error)."""
    with contextlib.suppress(ConnectionError, RuntimeError):
        writer.send_headers()  # type: ignore[attr-defined]


async def open_sse(
    request: web.Request, stall_timeout_s: float, turns: TurnWrites | None = None
) -> SseStream:
    resp = _SseResponse(status=200, headers=SSE_HEADERS)
    await resp.prepare(request)
    writer = request.writer
    if hasattr(writer, "send_headers"):
        asyncio.get_running_loop().call_later(HEADERS_WAIT_S, _send_headers, writer)
    return SseStream(resp, writer, request.transport, stall_timeout_s, turns)
