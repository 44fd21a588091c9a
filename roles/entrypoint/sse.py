"""Server-sent events out of an aiohttp handler; a client that went away, or stopped reading,
ends the stream.

What one stream can hold in the gateway while its client does not read::

    engine step --SseStream.send--> transport buffer --kernel--> client
                   |                  pauses the protocol above its high-water mark (64 KiB);
                   |                  aiohttp's write then waits for the drain once it wrote
                   |                  64 KiB more since the last one
                   \\-- the gateway pulls no step from upstream while a write waits; a write
                       that waits ``stall_timeout_s`` ends the stream (``SlowReader``): the
                       connection is aborted and the upstream stream closed (CANCEL)

so a stream buffers at most about 128 KiB plus one step's events in the transport, and the
engine steps that arrive during one stall (at most ``stall_timeout_s`` of them) in its
upstream queue.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web

SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache",
               "X-Accel-Buffering": "no"}


class ClientGone(Exception):
    """The HTTP client closed the connection mid-stream."""


class SlowReader(ClientGone):
    """The HTTP client read nothing for the stall timeout; the connection was aborted."""


class SseStream:
    """One streamed response: ``send`` writes one engine step's events as one chunk.

    ``write``: the prepared response's payload writer's ``write`` (the request's ``writer``),
    called directly: the response's own ``write`` only adds checks that hold here.
    ``peak_buffered``: the most bytes the transport held unsent before a write (bytes).
    """

    __slots__ = ("_high", "_transport", "_write", "peak_buffered", "resp", "stall_timeout_s")

    def __init__(self, resp: web.StreamResponse, write: Callable[[bytes], Awaitable[None]],
                 transport: asyncio.Transport | None, stall_timeout_s: float) -> None:
        self.resp = resp
        self.stall_timeout_s = stall_timeout_s
        self.peak_buffered = 0
        self._write = write
        self._transport = transport  # None: the client left before the stream began
        self._high = transport.get_write_buffer_limits()[1] if transport is not None else 0

    async def send(self, pieces: list[str]) -> None:
        """Write one step's events (at most one write per step); raises ClientGone / SlowReader."""
        if not pieces:
            return
        data = (pieces[0] if len(pieces) == 1 else "".join(pieces)).encode()
        transport = self._transport
        if transport is None:
            raise ClientGone("the client closed the connection before the stream began")
        buffered = transport.get_write_buffer_size()
        try:
            if buffered == 0 and len(data) <= self._high:
                # The client keeps up: this write cannot pause the protocol, so it never waits.
                await self._write(data)
                return
            self.peak_buffered = max(self.peak_buffered, buffered)
            async with asyncio.timeout(self.stall_timeout_s):
                await self._write(data)
        except TimeoutError:
            transport.abort()
            raise SlowReader(f"the client read nothing for {self.stall_timeout_s:g}s") from None
        except (ConnectionError, RuntimeError) as exc:
            raise ClientGone(str(exc)) from None


async def open_sse(request: web.Request, stall_timeout_s: float) -> SseStream:
    resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
    await resp.prepare(request)
    return SseStream(resp, request.writer.write, request.transport, stall_timeout_s)
