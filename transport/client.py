"""Peer: a connection to one role's ActorServer, with tell / ask / stream.

Each call gets a fresh ``call_id``; the socket's FramePump routes REPLY / ITEM / END / ERROR frames
to the waiting future or stream queue. A socket monitor watches the connection: when the peer goes away
(process killed, host gone, ZMTP heartbeat timeout) every pending call fails at once with
``PeerLost``; ZeroMQ reconnects by itself, and the Hello handshake is repeated on the new
connection before it is marked ready again. Calls made while the peer is away wait here, not in
the socket, until the Hello on the next connection is answered; a call its caller gives up on
first (its timeout, a cancel, ``fail_pending``) is dropped unsent. In ZeroMQ's queue it would go
out on the next connection whatever became of its caller, to whichever process then serves the
address: a restarted role would run work already re-run elsewhere. (A message handed to the
socket in the instant between a drop and its report can still go out that way: requests name
the run of the instance they are meant for, see dsi.roles.run_fence.) The handshake also
settles the protocol version the connection speaks (dsi.messages.version); calls made before
the first handshake wait here until it has, and then go in that version. Stream items queue
without bound on the caller's side (the pump serves every call and must never block); the
producer is paced by the socket high-water mark instead.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from dsi.errors import AskTimeout, DsiError, PeerLost, VersionMismatch, error_from_info
from dsi.messages.base import COMMON, Hello, Welcome
from dsi.messages.version import CURRENT, Protocol
from dsi.transport.security import CurveKeys, secure_client
from dsi.transport.sockets import FramePump, keep_receive_buffers, tune
from dsi.transport.wire import Codec, Kind, pack_header, read_header

log = logging.getLogger(__name__)
_END = object()
_TIMER_SLACK_S = 0.001  # loop timers have millisecond resolution and may fire that much early


REHELLO_PAUSE_S = 0.5  # between Hellos on one connection that were refused rather than unanswered


class Peer:
    """Client side of the control plane towards one address.

    ``types`` are the reply / item message classes this caller accepts. ``protocol``: the
    versions spoken (dsi.messages.version); another value only simulates a process of another
    version, in tests.
    """

    def __init__(
        self,
        address: str,
        ctx: zmq.asyncio.Context,
        *,
        types: Sequence[type] = (),
        peer_id: str = "client",
        role: str = "",
        keys: CurveKeys | None = None,
        timeout: float = 10.0,
        protocol: Protocol = CURRENT,
    ) -> None:
        self.address = address
        self.protocol = protocol
        self._version: int | None = None  # the version the connection speaks, once a handshake said
        # calls made while no connection is ready (before the first handshake, or while away)
        self._held: list[tuple[Kind, int, list[Any]]] = []
        self.peer_id = peer_id
        self.role = role
        self.timeout = timeout
        self.welcome: Welcome | None = None
        self.unsolicited_errors = 0
        self._codec = Codec([*types, *COMMON])
        self._ids = itertools.count(1)
        self._calls: dict[int, asyncio.Future] = {}
        # call_id -> (deadline on the loop clock, message name, timeout s), swept by one timer.
        self._deadlines: dict[int, tuple[float, str, float]] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        self._streams: dict[int, asyncio.Queue] = {}
        # A plain socket driven by a FramePump: pyzmq's asyncio futures cost more than a message.
        self._sock = ctx.socket(zmq.DEALER, socket_class=zmq.Socket)
        tune(self._sock)
        secure_client(self._sock, keys)
        self._monitor = self._sock.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self._sock.connect(address)
        # Copied as bytes: header, body; blob frames after them stay zero-copy.
        self._pump = FramePump(self._sock, self._route, copied=2, name=f"peer {address}", batch_at=0)
        keep_receive_buffers()
        self._connected = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._rehellos: set[asyncio.Task] = set()
        self._hellos = 0  # Hello calls in flight
        self._epoch = 0  # connection events seen (a handshake or a drop each starts a new epoch)
        self._live = False  # the current connection finished its ZMTP handshake
        self._closed = False

    async def connect(self, timeout: float | None = None) -> Welcome:
        """Start the frame pump and the monitor task and complete the Hello handshake."""
        loop = asyncio.get_running_loop()
        if not self._tasks:
            self._pump.start()
            self._tasks = [loop.create_task(self._watch(), name=f"peer {self.address} monitor")]
        try:
            await self._hello(timeout if timeout is not None else self.timeout)
        except AskTimeout:
            # The connection came up while this Hello was on its way, so no handshake event is
            # left to ask again: keep asking here, or the peer would stay unanswered for good.
            if self._live and not self._rehellos and not self._connected.is_set():
                self._ask_again(self._epoch)
            raise
        return self.welcome  # type: ignore[return-value]

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._held.clear()
        self._fail_all(PeerLost(f"connection to {self.address} closed"))
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._sweeper is not None:
            self._sweeper.cancel()
        self._pump.stop()
        self._sock.disable_monitor()
        self._monitor.close(linger=0)
        self._sock.close(linger=0)

    def fail_pending(self, err: DsiError) -> None:
        """Fail every pending call and stream with ``err`` now: the caller learned by other means
        (the controller's heartbeats) that the peer is gone while its connection still looks up."""
        self._fail_all(err)

    @property
    def connected(self) -> bool:
        """True while a connection is up and its handshake done (calls are answered)."""
        return self._connected.is_set()

    @property
    def pending(self) -> int:
        return len(self._calls) + len(self._streams)

    @property
    def away(self) -> bool:
        """True while a connection that had completed its handshake is down (from its drop until
        the Hello on the next one): a call made now waits in the socket queue."""
        return self.welcome is not None and not self._connected.is_set()

    # ---- calls -------------------------------------------------------------------------------
    def tell(self, msg: Any) -> None:
        self._send(Kind.TELL, 0, self._codec.encode(msg))

    async def ask(self, msg: Any, timeout: float | None = None) -> Any:
        return await self._call(Kind.ASK, msg, self.timeout if timeout is None else timeout)

    async def stream(self, msg: Any, timeout: float | None = None) -> AsyncIterator[Any]:
        """Items of a server-streaming call; ``timeout`` bounds the wait for each item."""
        wait = self.timeout if timeout is None else timeout
        call_id = next(self._ids)
        queue: asyncio.Queue = asyncio.Queue()  # unbounded: the receive task must never block
        self._streams[call_id] = queue
        finished = False
        try:
            self._send(Kind.STREAM, call_id, self._codec.encode(msg))
            while True:
                if queue.empty():
                    try:
                        item = await asyncio.wait_for(queue.get(), wait)
                    except TimeoutError:
                        raise AskTimeout(f"{self.address}: no stream item for {wait}s") from None
                else:  # items that arrived together: no timer, no task, no turn of the loop
                    item = queue.get_nowait()
                if item is _END:
                    finished = True
                    return
                if isinstance(item, DsiError):
                    finished = True
                    raise item
                yield item
        finally:
            self._streams.pop(call_id, None)
            while not finished and not queue.empty():  # the end arrived with the last item read
                finished = queue.get_nowait() is _END
            if not finished:
                self._withdraw(call_id)

    async def _call(self, kind: Kind, msg: Any, timeout: float) -> Any:
        call_id = next(self._ids)
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._calls[call_id] = future
        deadline = loop.time() + timeout
        self._deadlines[call_id] = (deadline, type(msg).__name__, timeout)
        if self._sweeper is None or deadline < self._sweeper.when():
            self._arm_sweeper(loop, deadline)
        try:
            self._send(kind, call_id, self._codec.encode(msg))
            return await future
        except asyncio.CancelledError:  # the caller went away: so does the call (a concurrent handler stops)
            if future.cancelled():
                self._withdraw(call_id)
            raise
        finally:
            self._calls.pop(call_id, None)
            self._deadlines.pop(call_id, None)

    # One timer for every pending call, not one per call: asyncio.wait_for costs an extra future
    # and callbacks, and a cancelled uvloop timer costs the loop an extra poll while it closes.
    def _arm_sweeper(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        self._sweeper = loop.call_at(when, self._sweep)

    def _sweep(self) -> None:
        """Fail every call past its deadline with AskTimeout (and CANCEL it); re-arm for the rest."""
        self._sweeper = None
        loop = asyncio.get_running_loop()
        now = loop.time() + _TIMER_SLACK_S
        for call_id, (deadline, what, timeout) in list(self._deadlines.items()):
            if deadline <= now:
                del self._deadlines[call_id]
                self._expire(call_id, what, timeout)
        if self._deadlines:
            self._arm_sweeper(loop, min(deadline for deadline, _, _ in self._deadlines.values()))

    def _expire(self, call_id: int, what: str, timeout: float) -> None:
        future = self._calls.get(call_id)
        if future is None or future.done():
            return
        future.set_exception(AskTimeout(f"{self.address}: no reply to {what} in {timeout}s"))
        self._withdraw(call_id)

    def _withdraw(self, call_id: int) -> None:
        """The caller gave up on ``call_id``: drop it unsent if it is still held here, else CANCEL it."""
        if self._closed:
            return
        held = len(self._held)
        self._held = [h for h in self._held if h[1] != call_id]
        if len(self._held) == held:
            self._send(Kind.CANCEL, call_id, [b""])

    def _send(self, kind: Kind, call_id: int, body: list[Any]) -> None:
        """Send [header, *body] in the connection's version; held while no connection has
        answered a Hello (before the first handshake, and while away).

        A Hello goes in the oldest version this process speaks: a server of the version before
        accepts it, and a later one accepts a Hello of any version."""
        if self._closed:
            raise PeerLost(f"connection to {self.address} is closed")
        if kind is Kind.HELLO:
            version = self.protocol.oldest
        elif not self._connected.is_set():  # set by a Hello's answer, which also settles _version
            self._held.append((kind, call_id, body))
            return
        else:
            version = self._version
        self._pump.send([pack_header(kind, call_id, version), *body])

    def _speak(self, version: int) -> None:
        """The handshake settled ``version``: send what waited for it, in order."""
        self._version = version
        held, self._held = self._held, []
        for kind, call_id, body in held:
            self._pump.send([pack_header(kind, call_id, version), *body])

    # ---- background tasks --------------------------------------------------------------------
    async def _hello(self, timeout: float) -> None:
        self._hellos += 1
        try:
            hello = Hello(self.protocol.version, self.peer_id, self.role)
            reply = await self._call(Kind.HELLO, hello, timeout)
            if not self.protocol.accepts(reply.version):
                raise VersionMismatch(
                    f"{self.address} speaks protocol version {reply.version}; this process speaks "
                    f"{self.protocol.oldest} to {self.protocol.version}"
                )
        except VersionMismatch as exc:  # refused either way: nothing waiting here will ever be served
            self._held.clear()
            self._fail_all(exc)
            raise
        finally:
            self._hellos -= 1
        self.welcome = reply
        self._speak(reply.version)
        self._connected.set()

    def _route(self, frames: list[Any]) -> None:
        """[header: bytes, body: bytes, *blobs: zmq.Frame] of one reply, item, end or error."""
        if len(frames) < 2:
            return
        try:
            # An error of any version is read: ErrorInfo is the same in every version.
            _, kind, call_id = read_header(frames[0], self.protocol, any_version=Kind.ERROR)
        except DsiError as exc:
            log.warning("peer %s: dropped a frame: %s", self.address, exc)
            return
        if kind is Kind.ERROR:
            err = error_from_info(self._codec.decode_error(frames[1]))
            self._deliver(call_id, err)
        elif kind is Kind.END:
            self._deliver(call_id, _END)
        elif kind in (Kind.REPLY, Kind.ITEM):
            try:
                msg = self._codec.decode(frames[1:])
            except DsiError as exc:
                msg = exc
            self._deliver(call_id, msg)

    def _deliver(self, call_id: int, value: Any) -> None:
        future = self._calls.get(call_id)
        if future is not None:
            if not future.done():
                if isinstance(value, BaseException):
                    future.set_exception(value)
                else:
                    future.set_result(value)
            return
        queue = self._streams.get(call_id)
        if queue is not None:
            queue.put_nowait(value)
        elif isinstance(value, DsiError):
            self.unsolicited_errors += 1
            log.debug("peer %s: error for finished call %d: %s", self.address, call_id, value)

    async def _watch(self) -> None:
        seen_connection = False
        while True:
            event = parse_monitor_message(await self._monitor.recv_multipart())
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self._epoch += 1
                self._connected.clear()
                # A connection whose handshake failed (wrong CURVE keys, not a dsi peer) never
                # took a call off the queue: those calls wait for the next connection instead.
                if self._live:
                    self._fail_all(PeerLost(f"{self.address} went away"))
                self._live = False
            elif event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._epoch += 1
                # A reconnect, or a first connection whose Hello already timed out in connect().
                if seen_connection or (self.welcome is None and not self._hellos):
                    self._ask_again(self._epoch)
                seen_connection = self._live = True

    def _ask_again(self, epoch: int) -> None:
        task = asyncio.get_running_loop().create_task(self._rehello(epoch))
        self._rehellos.add(task)
        task.add_done_callback(self._rehellos.discard)

    async def _rehello(self, epoch: int) -> None:
        """The Hello on a new connection, asked again while that connection stays up and
        unanswered (a process that restarted at the same address may bind long before its
        actors answer: a vLLM role loads for a minute). A Hello that times out once would
        otherwise leave the peer ``away`` for good. ``epoch``: the connection's, when it came up."""
        while not self._closed:
            try:
                await self._hello(self.timeout)
                log.info("peer %s: reconnected", self.address)
                return
            except VersionMismatch as exc:
                log.warning("peer %s: handshake after reconnect failed: %s", self.address, exc)
                return
            except DsiError as exc:
                if self._epoch != epoch or self._connected.is_set():
                    return  # dropped or replaced meanwhile: the next handshake asks again
                log.info("peer %s: no answer to the Hello yet (%s); asking again", self.address, exc)
                if not isinstance(exc, AskTimeout):  # refused at once (a stopping actor): no tight loop
                    await asyncio.sleep(REHELLO_PAUSE_S)

    def _fail_all(self, err: DsiError) -> None:
        """Fail every pending call and stream with ``err``; the held ones are dropped unsent
        (tells still wait for the next connection)."""
        self._held = [h for h in self._held if h[0] is Kind.TELL]
        for future in list(self._calls.values()):
            if not future.done():
                future.set_exception(err)
        for queue in list(self._streams.values()):
            queue.put_nowait(err)


async def connect_until_up(peer: Peer, what: str, retry_s: float = 1.0) -> None:
    """Complete ``peer``'s handshake, trying again every ``retry_s`` seconds until it answers (for
    callers that act only on a connected peer and must not go on before it is)."""
    while True:
        try:
            await peer.connect()
            return
        except DsiError as exc:
            log.info("%s %s not reachable yet (%s); trying again", what, peer.address, exc)
        await asyncio.sleep(retry_s)
