"""The HTTP workers of one entrypoint role ask each other for their metrics, so that the one a
scrape reaches answers for all of them.

    worker i listens on the abstract unix socket "\\0dsi-http-<tag>-<i>" (see WorkerSeat); it
    answers processes of its own user only (SO_PEERCRED)

    GET /metrics on worker i --MetricsAsk--> every other worker j, all at once
                             <--MetricsText(worker, text)-- (each within ASK_TIMEOUT_S)
        -> merge_metrics(i's text + the answers)   (dsi.roles.entrypoint.metrics_merge)

One connection per ask; a frame is a 4-byte big-endian length and the msgpack of one message.
An ask costs a worker one render of its metrics (tens of microseconds), so a scrape takes about
a millisecond; a worker that is gone (restarting) is refused at once, one that is stuck is
waited for ASK_TIMEOUT_S at most. Either is left out of the sums (``dsi_http_workers_answered``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
from collections.abc import Callable

import msgspec

from dsi.roles.entrypoint.metrics_merge import merge_metrics
from dsi.roles.entrypoint.seat import WorkerSeat

log = logging.getLogger(__name__)

ASK_TIMEOUT_S = 0.5
_MAX_FRAME = 64 << 20  # bytes: a metrics text is tens of kilobytes
_LENGTH = struct.Struct(">I")
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class MetricsAsk(msgspec.Struct, tag=True, forbid_unknown_fields=True):
    """Your metrics, please."""


class MetricsText(msgspec.Struct, tag=True, forbid_unknown_fields=True):
    worker: str  # the worker id (X-Dsi-Worker)
    text: str  # its /metrics text of its own


class WorkerLink:
    """One worker's end: answers the others' asks with ``render()`` and, for a scrape, asks them."""

    def __init__(self, seat: WorkerSeat, name: str, render: Callable[[], str]) -> None:
        self.seat = seat
        self.name = name
        self._render = render
        self._server: asyncio.AbstractServer | None = None
        self._ask_decoder = msgspec.msgpack.Decoder(MetricsAsk)
        self._text_decoder = msgspec.msgpack.Decoder(MetricsText)

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._answer, path=self.seat.address(self.seat.index))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def scrape(self) -> str:
        """The metrics of every worker that answers, merged (this one's always among them)."""
        others = [i for i in range(self.seat.count) if i != self.seat.index]
        answers = await asyncio.gather(*(self._ask(i) for i in others))
        texts = [self._render(), *(a.text for a in answers if a is not None)]
        return merge_metrics(texts, self.seat.count)

    async def _ask(self, index: int) -> MetricsText | None:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        writer = None
        try:
            async with asyncio.timeout(ASK_TIMEOUT_S):
                # Connected here: uvloop refuses an abstract address in open_unix_connection(path=).
                await loop.sock_connect(sock, self.seat.address(index))
                reader, writer = await asyncio.open_unix_connection(sock=sock)
                writer.write(_frame(MetricsAsk()))
                return self._text_decoder.decode(await _read_frame(reader))
        except (OSError, TimeoutError, asyncio.IncompleteReadError, msgspec.DecodeError) as exc:
            log.debug("%s: worker %d did not answer for metrics: %r", self.name, index, exc)
            return None
        finally:
            if writer is not None:
                writer.close()
            else:
                sock.close()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if not _same_user(writer.get_extra_info("socket")):
                return
            self._ask_decoder.decode(await _read_frame(reader))
            writer.write(_frame(MetricsText(self.name, self._render())))
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, msgspec.DecodeError) as exc:
            log.debug("%s: a metrics ask failed: %r", self.name, exc)
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


def _frame(msg: MetricsAsk | MetricsText) -> bytes:
    body = msgspec.msgpack.encode(msg)
    return _LENGTH.pack(len(body)) + body


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    if size > _MAX_FRAME:
        raise msgspec.DecodeError(f"a frame of {size} bytes (at most {_MAX_FRAME})")
    return await reader.readexactly(size)


def _same_user(sock: socket.socket | None) -> bool:
    """The peer runs as this process's user (an abstract socket has no file permissions)."""
    if sock is None:
        return False
    _pid, uid, _gid = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    return uid == os.getuid()
