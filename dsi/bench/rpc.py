"""``dsi bench rpc``: control-plane round trips and bulk throughput between two processes.

Every dsi figure is measured side by side with bare pyzmq in the same run, on loopback TCP, with
the serving side in a child process::

    dsi ask       Peer.ask(Call) -> ActorServer -> inbox -> handler -> REPLY    one call in flight
    raw rtt       sync pyzmq REQ -> REP, echo                                   one call in flight
    dsi bulk      Peer.tell(Bulk(1 MiB Blob)) x burst, then ask(Drain) as the ack
    raw bulk      sync pyzmq PUSH 1 MiB frames x burst, then an empty marker; PULL acks over PUSH

Both bulk sides send the same buffer zero-copy and wait for an ack that carries the byte count
received, so the time covers delivery, not just queueing. The dsi client and server run on uvloop;
the raw server is plain blocking pyzmq. Within a repeat, dsi and baseline alternate in slices of
0.1 s so that both see the same load on a shared machine; each figure is the median over repeats.
Throughput is in Gbit/s (1e9 bits per second).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import uvloop
import zmq
import zmq.asyncio

from dsi.actor import Actor, handles
from dsi.bench.child import stop_process
from dsi.messages.base import Message
from dsi.messages.blob import Blob
from dsi.transport.client import Peer
from dsi.transport.server import ActorServer

_LOOPBACK = "tcp://127.0.0.1:*"
_ADDRESS_WAIT_S = 30.0
_RTT_PAYLOAD = bytes(16)  # about the size of an encoded Call body plus its header
_ACK = 8  # bytes of the raw bulk ack (little-endian byte count)
_SLICE_S = 0.1  # seconds: dsi and baseline alternate at this grain within a repeat


class Call(Message):
    seq: int


class Bulk(Message):
    data: Blob


class Drain(Message):
    """Answered once every Bulk sent before it has been handled (the inbox is FIFO)."""


class Drained(Message):
    nbytes: int


REPLY_TYPES = (Call, Drained)


class BenchActor(Actor):
    """Echoes calls and counts bulk bytes; a Drain answers with the count and resets it."""

    def __init__(self) -> None:
        super().__init__("bench")
        self.received = 0

    # Plain functions: none of them waits, so each runs inline when the actor is idle.
    @handles
    def call(self, msg: Call) -> Call:
        return msg

    @handles
    def bulk(self, msg: Bulk) -> None:
        self.received += msg.data.nbytes

    @handles
    def drain(self, msg: Drain) -> Drained:
        received, self.received = self.received, 0
        return Drained(received)


@dataclass(frozen=True, slots=True)
class RpcFigures:
    """Medians over ``repeats``; latencies in microseconds, throughput in Gbit/s."""

    ask_per_s: float
    ask_p50_us: float
    ask_p99_us: float
    raw_per_s: float
    raw_p50_us: float
    raw_p99_us: float
    ask_ratio: float
    bulk_gbps: float
    raw_bulk_gbps: float
    bulk_ratio: float
    pipelined_ask_per_s: float
    repeats: int
    seconds: float
    frame_bytes: int
    window: int


@dataclass(frozen=True, slots=True)
class _RoundTrips:
    per_s: float
    p50_us: float
    p99_us: float


# ---- serving side (child processes) -----------------------------------------------------------
def _serve_dsi_main(conn: Connection) -> None:
    uvloop.run(_serve_dsi(conn))


async def _serve_dsi(conn: Connection) -> None:
    ctx = zmq.asyncio.Context()
    server = ActorServer(BenchActor(), _LOOPBACK, ctx, role="bench")
    await server.start()
    conn.send(server.address)
    await asyncio.Event().wait()  # serves until the parent terminates this process


def _serve_raw_main(conn: Connection) -> None:
    ctx = zmq.Context()
    rep, pull, ack = ctx.socket(zmq.REP), ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    addresses = []
    for sock in (rep, pull, ack):
        sock.bind(_LOOPBACK)
        addresses.append(sock.getsockopt_string(zmq.LAST_ENDPOINT))
    threading.Thread(target=_raw_echo, args=(rep,), daemon=True).start()
    threading.Thread(target=_raw_sink, args=(pull, ack), daemon=True).start()
    conn.send(addresses)
    threading.Event().wait()  # serves until the parent terminates this process


def _raw_echo(rep: zmq.Socket) -> None:
    while True:
        rep.send(rep.recv())


def _raw_sink(pull: zmq.Socket, ack: zmq.Socket) -> None:
    received = 0
    while True:
        frame = pull.recv(copy=False)
        if len(frame):
            received += len(frame)
        else:
            ack.send(received.to_bytes(_ACK, "little"))
            received = 0


class _Child:
    """A serving process started with spawn; ``address`` is what it reported once bound."""

    def __init__(self, target: Callable[[Connection], None]) -> None:
        mp = multiprocessing.get_context("spawn")
        here, there = mp.Pipe()
        self.process = mp.Process(target=target, args=(there,), daemon=True)
        self.process.start()
        there.close()
        if not here.poll(_ADDRESS_WAIT_S):
            self.stop()
            raise RuntimeError(f"{target.__name__} did not report its address in {_ADDRESS_WAIT_S}s")
        self.address: Any = here.recv()

    def stop(self) -> None:
        stop_process(self.process)


# ---- calling side -----------------------------------------------------------------------------
@dataclass(slots=True)
class _Tally:
    """What one figure accumulated over the slices of one repeat."""

    elapsed_s: float = 0.0
    nbytes: int = 0
    latencies_ns: list[int] = field(default_factory=list)

    def round_trips(self) -> _RoundTrips:
        ordered = sorted(self.latencies_ns)
        at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e3  # noqa: E731
        return _RoundTrips(len(ordered) / self.elapsed_s, at(0.50), at(0.99))

    def gbps(self) -> float:
        return self.nbytes * 8 / self.elapsed_s / 1e9


async def _dsi_asks(peer: Peer, seconds: float, tally: _Tally) -> None:
    clock, msg, latencies = time.perf_counter_ns, Call(0), tally.latencies_ns
    start = clock()
    deadline = start + int(seconds * 1e9)
    while True:
        sent = clock()
        await peer.ask(msg)
        done = clock()
        latencies.append(done - sent)
        if done >= deadline:
            tally.elapsed_s += (done - start) / 1e9
            return


def _raw_asks(req: zmq.Socket, seconds: float, tally: _Tally) -> None:
    clock, payload, latencies = time.perf_counter_ns, _RTT_PAYLOAD, tally.latencies_ns
    start = clock()
    deadline = start + int(seconds * 1e9)
    while True:
        sent = clock()
        req.send(payload)
        req.recv()
        done = clock()
        latencies.append(done - sent)
        if done >= deadline:
            tally.elapsed_s += (done - start) / 1e9
            return


async def _pipelined_asks(peer: Peer, seconds: float, window: int) -> float:
    """Asks per second with ``window`` callers each keeping one ask in flight."""
    msg, loop = Call(0), asyncio.get_running_loop()
    deadline = loop.time() + seconds

    async def caller() -> int:
        n = 0
        while loop.time() < deadline:
            await peer.ask(msg)
            n += 1
        return n

    start = time.perf_counter()
    counts = await asyncio.gather(*(caller() for _ in range(window)))
    return sum(counts) / (time.perf_counter() - start)


async def _dsi_bulk(peer: Peer, seconds: float, frame: bytes, burst: int, tally: _Tally) -> None:
    msg = Bulk(Blob(frame))
    start = time.perf_counter()
    while True:
        for _ in range(burst):
            peer.tell(msg)
        got = (await peer.ask(Drain())).nbytes
        _check_delivered(got, burst * len(frame))
        tally.nbytes += got
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            tally.elapsed_s += elapsed
            return


def _raw_bulk(
    push: zmq.Socket, ack: zmq.Socket, seconds: float, frame: bytes, burst: int, tally: _Tally
) -> None:
    start = time.perf_counter()
    while True:
        for _ in range(burst):
            push.send(frame, copy=False)
        push.send(b"")
        got = int.from_bytes(ack.recv(), "little")
        _check_delivered(got, burst * len(frame))
        tally.nbytes += got
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            tally.elapsed_s += elapsed
            return


def _check_delivered(got: int, expected: int) -> None:
    if got != expected:
        raise RuntimeError(f"bulk burst delivered {got} of {expected} bytes; the figure would be wrong")


class _RawClient:
    """Blocking pyzmq sockets towards the raw server: REQ for round trips, PUSH/PULL for bulk."""

    def __init__(self, addresses: list[str]) -> None:
        self._ctx = zmq.Context()
        self.req, self.push, self.ack = (self._ctx.socket(k) for k in (zmq.REQ, zmq.PUSH, zmq.PULL))
        for sock, address in zip((self.req, self.push, self.ack), addresses, strict=True):
            sock.connect(address)

    def close(self) -> None:
        self._ctx.destroy(linger=0)


@dataclass(frozen=True, slots=True)
class _Run:
    seconds: float
    repeats: int
    frame_bytes: int
    burst: int
    window: int


async def _measure(run: _Run, dsi_address: str, raw: _RawClient) -> RpcFigures:
    ctx = zmq.asyncio.Context()
    peer = Peer(dsi_address, ctx, types=REPLY_TYPES, peer_id="bench", timeout=30.0)
    try:
        await peer.connect()
        frame = bytes(run.frame_bytes)
        await _repeat(peer, raw, run, frame, min(run.seconds, 0.2))  # warm-up
        rows = [await _repeat(peer, raw, run, frame, run.seconds) for _ in range(run.repeats)]
    finally:
        await peer.close()
        ctx.destroy(linger=0)
    med = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
    return RpcFigures(
        **med,
        ask_ratio=med["ask_per_s"] / med["raw_per_s"],
        bulk_ratio=med["bulk_gbps"] / med["raw_bulk_gbps"],
        repeats=run.repeats,
        seconds=run.seconds,
        frame_bytes=run.frame_bytes,
        window=run.window,
    )


async def _repeat(peer: Peer, raw: _RawClient, run: _Run, frame: bytes, seconds: float) -> dict[str, float]:
    """One repeat: each dsi figure and its baseline in alternating slices of about ``_SLICE_S``.

    The machine may be shared; slicing puts both sides of a ratio under the same load.
    """
    slices = max(1, round(seconds / _SLICE_S))
    part = seconds / slices
    ask, base, bulk, raw_bulk = _Tally(), _Tally(), _Tally(), _Tally()
    for i in range(slices):
        if i % 2:
            _raw_asks(raw.req, part, base)
        await _dsi_asks(peer, part, ask)
        if not i % 2:
            _raw_asks(raw.req, part, base)
    for i in range(slices):
        if i % 2:
            _raw_bulk(raw.push, raw.ack, part, frame, run.burst, raw_bulk)
        await _dsi_bulk(peer, part, frame, run.burst, bulk)
        if not i % 2:
            _raw_bulk(raw.push, raw.ack, part, frame, run.burst, raw_bulk)
    dsi_rt, raw_rt = ask.round_trips(), base.round_trips()
    return {
        "ask_per_s": dsi_rt.per_s,
        "ask_p50_us": dsi_rt.p50_us,
        "ask_p99_us": dsi_rt.p99_us,
        "raw_per_s": raw_rt.per_s,
        "raw_p50_us": raw_rt.p50_us,
        "raw_p99_us": raw_rt.p99_us,
        "bulk_gbps": bulk.gbps(),
        "raw_bulk_gbps": raw_bulk.gbps(),
        "pipelined_ask_per_s": await _pipelined_asks(peer, seconds, run.window),
    }


def run_rpc_bench(
    seconds: float = 1.0, repeats: int = 5, frame_bytes: int = 1 << 20, burst: int = 32, window: int = 64
) -> RpcFigures:
    """Start both serving processes, measure, and always terminate them.

    ``seconds`` is the length of each measurement, ``burst`` the number of bulk frames between
    acks, ``window`` the number of asks in flight for the pipelined figure.
    """
    if seconds <= 0 or repeats < 1 or frame_bytes < 1 or burst < 1 or window < 1:
        raise ValueError("seconds, repeats, frame_bytes, burst and window must be positive")
    run = _Run(seconds, repeats, frame_bytes, burst, window)
    children: list[_Child] = []
    raw: _RawClient | None = None
    try:
        children.append(_Child(_serve_dsi_main))
        children.append(_Child(_serve_raw_main))
        raw = _RawClient(children[1].address)
        return uvloop.run(_measure(run, children[0].address, raw))
    finally:
        if raw is not None:
            raw.close()
        for child in children:
            child.stop()


# ---- command line -----------------------------------------------------------------------------
def format_table(fig: RpcFigures) -> str:
    rows = [
        ("round trips /s", fig.ask_per_s, fig.raw_per_s, f"{fig.ask_ratio:.2f}  (target >= 0.5)"),
        ("  p50 latency us", fig.ask_p50_us, fig.raw_p50_us, ""),
        ("  p99 latency us", fig.ask_p99_us, fig.raw_p99_us, ""),
        (
            f"bulk {fig.frame_bytes >> 10} KiB Gbit/s",
            fig.bulk_gbps,
            fig.raw_bulk_gbps,
            f"{fig.bulk_ratio:.2f}  (target >= 0.8)",
        ),
        (f"pipelined asks /s ({fig.window})", fig.pipelined_ask_per_s, None, ""),
    ]
    lines = [
        f"dsi bench rpc: two processes on loopback, median of {fig.repeats} x {fig.seconds:g} s",
        f"{'':26}{'dsi':>12}{'raw pyzmq':>12}   ratio",
    ]
    for name, dsi, raw, ratio in rows:
        raw_text = f"{raw:>12,.1f}" if raw is not None else f"{'-':>12}"
        lines.append(f"{name:26}{dsi:>12,.1f}{raw_text}   {ratio}".rstrip())
    return "\n".join(lines)


def _main(args: argparse.Namespace) -> int:
    fig = run_rpc_bench(args.seconds, args.repeats, args.frame_kib << 10, args.burst, args.window)
    print(json.dumps(asdict(fig)) if args.json else format_table(fig))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("rpc", help="ask round trips and 1 MiB bulk vs bare pyzmq, two processes")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--seconds", type=float, default=1.0, help="length of each measurement (s)")
    parser.add_argument("--repeats", type=int, default=5, help="repeats; figures are medians")
    parser.add_argument("--frame-kib", type=int, default=1024, help="bulk frame size (KiB)")
    parser.add_argument("--burst", type=int, default=32, help="bulk frames between acks")
    parser.add_argument("--window", type=int, default=64, help="asks in flight for the pipelined figure")
    parser.set_defaults(func=_main)
