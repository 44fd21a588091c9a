"""Server-sent events out of an aiohttp handler; a client that went away ends the stream."""

from __future__ import annotations

from aiohttp import web

SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache",
               "X-Accel-Buffering": "no"}


class ClientGone(Exception):
    """The HTTP client closed the connection mid-stream."""


async def open_sse(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
    await resp.prepare(request)
    return resp


async def send(resp: web.StreamResponse, pieces: list[str]) -> None:
    """Write one engine step's events as one chunk (at most one write per step)."""
    if not pieces:
        return
    try:
        await resp.write("".join(pieces).encode())
    except (ConnectionResetError, ConnectionError, RuntimeError) as exc:
        raise ClientGone(str(exc)) from None
