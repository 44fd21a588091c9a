"""Socket options shared by every control-plane socket, and the pump that moves their frames.

Bounds (the documented backpressure chain): each socket queues at most ``HWM`` messages per
peer. A server's ROUTER (``ZMQ_ROUTER_MANDATORY``) holds what it sends to a peer whose queue is
full, in order, for up to ``STALL_LIMIT_S`` (dsi.transport.stalls), and a stream waits while its
reader is stalled; only then are the messages dropped, counted and logged - the caller's ask
then times out, a stream's reader sees the gap in its numbers. A client's DEALER send waits
while its queue is full, so a caller that outruns a role slows down instead of growing memory.
Inbox limits on the actor side answer ``Overloaded`` before the socket queues ever fill in
normal operation.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import logging
import resource
from collections.abc import Callable
from typing import Any

import zmq
import zmq.asyncio

from dsi.transport.stalls import StalledPeers
from dsi.transport.wire import HEADER_SIZE, Kind, pack_header, peek_call_id

log = logging.getLogger(__name__)

HWM = 10_000
STALL_LIMIT_S = 30.0  # seconds a ROUTER holds the messages of a peer whose queue is full
HEARTBEAT_IVL_MS = 1_000  # ZMTP pings on idle connections
HEARTBEAT_TIMEOUT_MS = 3_000  # a peer silent this long is disconnected
RECONNECT_IVL_MS = 100
RECONNECT_IVL_MAX_MS = 2_000
# glibc mallopt parameters, and the values keep_receive_buffers sets.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
RECV_MMAP_THRESHOLD = 32 << 20  # bytes: frames up to this size reuse heap memory
RECV_TRIM_THRESHOLD = 256 << 20  # bytes of free heap an arena keeps before giving memory back
# Plain ints: pyzmq's enum flags cost a conversion on every call.
_NOBLOCK, _RCVMORE, _EVENTS = int(zmq.NOBLOCK), int(zmq.RCVMORE), int(zmq.EVENTS)
_MORE_NOBLOCK = int(zmq.SNDMORE) | _NOBLOCK
_POLLIN, _POLLOUT = int(zmq.POLLIN), int(zmq.POLLOUT)


# Sockets one context may hold. ZeroMQ's default (1023) holds only about 340 Peers, each a
# DEALER and the two PAIR sockets of its monitor: fewer than the engine instances a gateway keeps
# a Peer to. Past this, what bounds a process is its file descriptors (about four per Peer).
MAX_SOCKETS = 32_768


def raise_open_files_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit (each Peer takes about four
    descriptors, and a common soft limit of 1,024 would cap a gateway near 250 instances); the
    soft limit now. A limit the process may not raise stays as it is."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-files limit from %d to %d: %s", soft, hard, exc)
    return soft


def peers_context() -> zmq.asyncio.Context:
    """A context for a process that keeps a Peer per instance of the cluster (a gateway, an
    engine role): room for MAX_SOCKETS sockets, and the open-files limit raised to match."""
    raise_open_files_limit()
    ctx = zmq.asyncio.Context()
    ctx.set(zmq.MAX_SOCKETS, MAX_SOCKETS)
    return ctx


def tune(sock: zmq.Socket) -> None:
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, HWM)
    sock.setsockopt(zmq.RCVHWM, HWM)
    sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
    sock.setsockopt(zmq.HEARTBEAT_TTL, HEARTBEAT_TIMEOUT_MS)
    sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)


def keep_receive_buffers() -> None:
    """Let glibc recycle the buffers libzmq allocates for large frames instead of unmapping them.

    libzmq's I/O thread mallocs one buffer per large frame; the consumer frees it later, on its
    own thread, often with a few more frames in flight. glibc's dynamic thresholds trim an arena
    as soon as its free top passes twice the largest freed chunk (2 MiB for 1 MiB frames), so
    every frame faults fresh zeroed pages back in: measured, about half the bulk throughput of
    the same sockets. Fixed thresholds stop the churn. Process-wide and idempotent; a no-op where
    the C library has no ``mallopt``.
    """
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(_M_MMAP_THRESHOLD, RECV_MMAP_THRESHOLD)
        mallopt(_M_TRIM_THRESHOLD, RECV_TRIM_THRESHOLD)


def bound_address(sock: zmq.Socket) -> str:
    """The endpoint actually bound (resolves ``tcp://127.0.0.1:*`` wildcards)."""
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


# Small bytes frames (headers, msgpack bodies) are sent with copy=True: a zero-copy send builds a
# zmq.Frame with a release callback, which costs far more than copying a few hundred bytes.
_ZERO_COPY_MIN = 64 * 1024


def _is_batch(header: Any) -> bool:
    """Whether a header frame (bytes) opens a BATCH message, of any protocol version: the
    receiver checks the version of each message in it."""
    return (
        type(header) is bytes
        and len(header) == HEADER_SIZE
        and header[4] == _BATCH_KIND
        and header[:3] == _MAGIC
    )


_MAGIC, _BATCH_KIND = pack_header(Kind.BATCH, 0)[:3], int(Kind.BATCH)


class FramePump:
    """Moves whole multipart messages between one socket and the event loop, one callback each.

    pyzmq's asyncio sockets build a future, an event-state update and a poller callback for
    every message; on the control plane that costs more than the message itself. The pump
    registers the socket's ZMQ_FD with the loop once and calls ``on_message`` straight from the
    wake-up; messages already queued behind it are drained with non-blocking receives, at most
    ``_BATCH`` per loop turn.

    ZMQ_FD is edge-triggered: any send or receive may take the wake-up of a message that arrives
    meanwhile, and a message queued behind one just received never signals at all. So after any
    operation the pump arms one ZMQ_EVENTS check, run before the loop next sleeps; a receive and
    the reply sent in the same turn share it (one poll syscall per round trip, not two).
    A send that would block (a DEALER at its high-water mark) waits in ``_outbox``, in order,
    and later sends queue behind it until the socket turns writable again. A ROUTER with
    ``ZMQ_ROUTER_MANDATORY`` (``stall_limit_s`` given) keeps one such queue per peer instead
    (``stalls``, see dsi.transport.stalls), so a peer that reads nothing holds up no other.

    Receive copy policy: the first ``copied`` frames of a message (routing id, header, msgpack
    body: small) arrive as ``bytes``, cheaper than a ``zmq.Frame`` for small frames; the blob
    frames after them arrive zero-copy as ``zmq.Frame``. Sends pass ``copy=False``, which pyzmq
    turns into a copy below its 64 KiB ``copy_threshold``.
    """

    _BATCH = 64  # messages received per loop turn before other callbacks get theirs

    def __init__(
        self,
        sock: zmq.Socket,
        on_message: Callable[[list[Any]], None],
        copied: int,
        name: str = "",
        batch_at: int | None = None,
        stall_limit_s: float | None = None,
    ) -> None:
        self.name = name
        # Batching (None: off): the index of the header frame, after the routing id if any.
        self._batch_at = batch_at
        self._pending: dict[bytes, list[list[Any]]] = {}
        self._flush_armed = False
        self._sock = sock
        self._on_message = on_message
        self._copied = copied
        self._fd = sock.getsockopt(zmq.FD)
        # The backend's send: pyzmq's wrapper adds routing-id and group handling this never uses.
        self._send_frame = super(zmq.Socket, sock).send
        self._outbox: collections.deque[list[Any]] = collections.deque()
        self.stalls = StalledPeers(self._send_now, name, stall_limit_s) if stall_limit_s is not None else None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._armed = False

    def start(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(self._fd, self._wake)
            self._arm()  # messages may be queued already, with their wake-up long gone

    def stop(self) -> None:
        if self._pending:  # what this turn queued still goes, as it would have unbatched
            self._send_pending()
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._fd)
        self._loop = None
        self._outbox.clear()
        if self.stalls is not None:
            self.stalls.close()

    def send(self, frames: list[Any]) -> None:
        """Queue one multipart message; never blocks. Raises ZMQError other than EAGAIN.

        With batching on (and the pump started), the message leaves at the end of this turn of
        the loop, in one BATCH message with the others queued for the same peer meanwhile; a
        ZMQError then is logged, not raised (the peer is gone: what a ROUTER would drop anyway).
        """
        if self._batch_at is not None and self._loop is not None:
            key = frames[0] if self._batch_at else b""
            queued = self._pending.get(key)
            if queued is None:
                self._pending[key] = [frames]
            else:
                queued.append(frames)
            if not self._flush_armed:
                self._flush_armed = True
                self._loop.call_soon(self._send_pending)
            return
        self._send_one(frames)

    def _send_one(self, frames: list[Any]) -> None:
        if self.stalls is not None:  # a ROUTER: a full peer waits alone
            self.stalls.send(frames)
            self._arm()
            return
        if self._outbox:
            self._outbox.append(frames)
            return
        try:
            self._send_now(frames)
        except zmq.Again:
            self._outbox.append(frames)
        self._arm()

    # ---- internals ---------------------------------------------------------------------------
    def _send_pending(self) -> None:
        """Send what this turn queued: per peer, runs of blob-free messages as BATCH messages."""
        self._flush_armed = False
        pending, self._pending = self._pending, {}
        at = self._batch_at
        assert at is not None
        plain = at + 2  # frames of a message without blobs: [routing id], header, body
        for messages in pending.values():
            run: list[list[Any]] = []
            for frames in messages:
                if len(frames) == plain:
                    run.append(frames)
                    continue
                self._send_run(run, at)
                run = []
                self._send_logged(frames)
            self._send_run(run, at)

    def _send_run(self, run: list[list[Any]], at: int) -> None:
        if len(run) == 1:
            self._send_logged(run[0])
        elif run:
            # In the version of the messages it holds (one peer's connection speaks one).
            batch = [*run[0][:at], pack_header(Kind.BATCH, len(run), run[0][at][3])]
            for frames in run:
                batch += frames[at:]
            self._send_logged(batch)

    def _send_logged(self, frames: list[Any]) -> None:
        try:
            self._send_one(frames)
        except zmq.ZMQError as exc:
            log.debug("%s: dropped a message to a gone peer: %s", self.name, exc)

    def _split(self, frames: list[Any]) -> None:
        """Hand on each message of a BATCH message; a malformed one is handed on whole."""
        at = self._batch_at
        assert at is not None
        head, parts = frames[:at], frames[at + 1 :]
        count = peek_call_id(frames[at])
        if count < 2 or count != len(parts) // 2 or len(parts) % 2:
            self._deliver(frames)  # malformed: its receiver answers (or drops) a BATCH it cannot take
            return
        for i in range(0, len(parts), 2):
            self._deliver([*head, parts[i], parts[i + 1]])

    def _deliver(self, frames: list[Any]) -> None:
        try:
            self._on_message(frames)
        except Exception:  # nothing a peer sends may stop the pump
            log.exception("%s: unexpected error while handling a message", self.name)

    def _wake(self) -> None:
        """ZMQ_FD turned readable."""
        if self._loop is not None:
            self._receive_one()
            self._arm()  # shared with the sends the handlers make this turn

    def _arm(self) -> None:
        if not self._armed and self._loop is not None:
            self._armed = True
            self._loop.call_soon(self._check)

    def _check(self) -> None:
        """ZMQ_EVENTS: receive what is queued (a batch per turn) and flush the outbox if it can."""
        self._armed = False
        for _ in range(self._BATCH):
            if self._loop is None:
                return
            events = self._sock.getsockopt(_EVENTS)
            if not (events & _POLLIN or (self._outbox and events & _POLLOUT)):
                return  # ZMQ_FD is armed again
            if self._receive_one() > self._copied:
                break  # blob frames: let their consumer run first, so a burst holds one buffer
        self._arm()

    def _receive_one(self) -> int:
        """Flush the outbox, then receive and hand on one message; its frame count, 0 if none."""
        if self._outbox:
            self._flush()
        sock, copied, at = self._sock, self._copied, self._batch_at
        try:
            frames = [sock.recv(_NOBLOCK)]
        except zmq.Again:
            return 0
        batch = False
        while sock.getsockopt(_RCVMORE):
            if at is not None and len(frames) == at + 1:
                batch = _is_batch(frames[at])  # every frame of a batch is small: copy them all
            frames.append(sock.recv(0, copy=batch or len(frames) < copied))
        if batch:
            self._split(frames)
            return 1
        self._deliver(frames)
        return len(frames)

    def _send_now(self, frames: list[Any]) -> None:
        """send_multipart without its per-frame type checks and enum flag arithmetic.

        Only the first frame can raise EAGAIN: ZeroMQ queues a multipart message whole or not
        at all.
        """
        send, last = self._send_frame, len(frames) - 1
        for i in range(last):
            frame = frames[i]
            send(frame, _MORE_NOBLOCK, copy=type(frame) is bytes and len(frame) < _ZERO_COPY_MIN)
        frame = frames[last]
        send(frame, _NOBLOCK, copy=type(frame) is bytes and len(frame) < _ZERO_COPY_MIN)

    def _flush(self) -> None:
        while self._outbox:
            try:
                self._send_now(self._outbox[0])
            except zmq.Again:
                return
            self._outbox.popleft()
