"""What a peer without the cluster's keys can try against live roles (tests/roles/two_hosts_client.py).

Every probe waits ``NO_REPLY_S`` at most and returns an outcome, and the test decides: ``NO_REPLY``
when nothing came back, else what did. The probes use dsi's own client code where it exists, with
no keys or keys no role admits (``intruder_keys``), and raw sockets where it does not:

    control plane   Peer.ask / Peer.stream          without keys, an unadmitted client key, a
                                                    made-up server key
    data plane      TcpDataPlane.send               the same three
                    frames on a DEALER              a clear Chunk, forged Hello and record frames,
                                                    a replayed Hello (its first use is answered)
    pub/sub         Subscriber                      the deltas heard
    any port        a plain TCP connection          random bytes; ZMTP 3.0 spoken by hand (NULL
                                                    mechanism, as a DEALER) and one message
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
from typing import Any

import zmq
import zmq.asyncio

from dsi.errors import AskTimeout, DsiError, PeerLost, TransferFailed, TransferTimeout
from dsi.messages import ALL
from dsi.transport.client import Peer
from dsi.transport.kv import KvTarget, make_data_plane
from dsi.transport.kv.handshake import HELLO_BYTES, MAGIC, RECORD, ClientHandshake
from dsi.transport.kv.linkkeys import LinkKeys
from dsi.transport.pubsub import Subscriber
from dsi.transport.security import CurveKeys

NO_REPLY_S = 1.5  # how long a probe waits for the answer that must not come
NO_REPLY = "no reply"
WELCOME = "welcome"  # a data plane's answer to a Hello that proves an admitted key


def intruder_keys(server_public: bytes | None) -> CurveKeys:
    """A client keypair no role admits; beside the cluster's (public) server key, or a made-up one."""
    public, secret = zmq.curve_keypair()
    return CurveKeys(server_public or zmq.curve_keypair()[0], None, public, secret, None)


# ---- control plane -----------------------------------------------------------------------------
async def call(
    ctx: zmq.asyncio.Context, address: str, msg: Any, keys: CurveKeys | None, stream: bool = False
) -> str:
    """What an ask (or the first item of a stream) of ``msg`` gets: an error reply is a reply too."""
    peer = Peer(address, ctx, types=ALL, keys=keys, timeout=NO_REPLY_S, peer_id="intruder")
    try:
        async with asyncio.timeout(NO_REPLY_S):
            await peer.connect(timeout=NO_REPLY_S)
            if stream:
                async with contextlib.aclosing(peer.stream(msg, timeout=NO_REPLY_S)) as items:
                    reply = await anext(items, None)
            else:
                reply = await peer.ask(msg, timeout=NO_REPLY_S)
    except (AskTimeout, PeerLost, TimeoutError):
        return NO_REPLY
    except DsiError as error:
        return f"error reply: {type(error).__name__}: {error}"
    finally:
        await peer.close()
    return f"reply: {type(reply).__name__}"


async def deltas_heard(ctx: zmq.asyncio.Context, address: str, keys: CurveKeys | None) -> int:
    """Messages a subscriber with ``keys`` hears from a publisher in ``NO_REPLY_S``."""
    sub = Subscriber(address, ctx, types=ALL, keys=keys)
    heard = 0
    try:
        async with asyncio.timeout(NO_REPLY_S):
            while True:
                await sub.recv()
                heard += 1
    except TimeoutError:
        return heard
    finally:
        sub.close()


# ---- data plane --------------------------------------------------------------------------------
async def push(address: str, keys: CurveKeys | None, transfer_id: str) -> str:
    """What dsi's own tcp sender gets when it writes 4 KiB into ``transfer_id`` at ``address``."""
    sender = make_data_plane("tcp", keys=keys)  # it only sends: never started, no listener
    try:
        await sender.send(KvTarget("tcp", address, transfer_id, 4096), [os.urandom(4096)], NO_REPLY_S)
    except TransferTimeout:
        return NO_REPLY
    except TransferFailed as error:
        return f"refused: {error}"
    finally:
        await sender.close()
    return "acked"


async def frames(ctx: zmq.asyncio.Context, address: str, message: list[bytes]) -> str:
    """What one ``message`` (its frames) sent on a fresh DEALER connection gets."""
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(address)
    try:
        await sock.send_multipart(message)
        if await sock.poll(NO_REPLY_S * 1000):
            reply = await sock.recv_multipart()
            return WELCOME if reply[0][:5] == MAGIC + b"W" else f"reply: {reply!r:.200}"
        return NO_REPLY
    finally:
        sock.close()


def forged_hello() -> bytes:
    """A Hello of the right size and kind whose keys and tag are random."""
    return MAGIC + b"H" + os.urandom(HELLO_BYTES - 5)


def forged_record(payload: int = 4096) -> list[bytes]:
    """A sealed chunk's two frames, as a sender with no session would forge them."""
    head = struct.pack(">4scQQ", MAGIC, RECORD, 0, payload)
    return [head + os.urandom(64), os.urandom(payload + 16)]


async def hello_replayed(ctx: zmq.asyncio.Context, address: str, keys: CurveKeys) -> tuple[str, str]:
    """(what an admitted Hello gets, what the same Hello sent again on another connection gets)."""
    hello = ClientHandshake(LinkKeys.from_curve(keys)).hello
    first = await frames(ctx, address, [hello])
    return first, await frames(ctx, address, [hello])


# ---- any port ------------------------------------------------------------------------------------
_GREETING = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + bytes(32)


def _command(name: bytes, properties: dict[bytes, bytes]) -> bytes:
    body = bytes([len(name)]) + name
    body += b"".join(bytes([len(k)]) + k + struct.pack(">I", len(v)) + v for k, v in properties.items())
    return bytes([0x04, len(body)]) + body


def _frame(body: bytes, more: bool) -> bytes:
    return bytes([0x03 if more else 0x02]) + struct.pack(">Q", len(body)) + body


def _messages(data: bytes) -> list[bytes]:
    """The message frames (not commands) in a ZMTP 3 byte stream, complete ones only."""
    found, at = [], 0
    while at + 2 <= len(data):
        flags = data[at]
        if flags & 0x02:
            if at + 9 > len(data):
                break
            size, at = struct.unpack(">Q", data[at + 1 : at + 9])[0], at + 9
        else:
            size, at = data[at + 1], at + 2
        if not flags & 0x04:
            found.append(data[at : at + size])
        at += size
    return found


async def raw_garbage(address: str, nbytes: int = 512) -> str:
    """What ``nbytes`` random bytes on a plain TCP connection get back, beyond the 10 bytes of a
    ZMTP signature that every ZeroMQ listener sends first."""
    got = await _raw(address, [os.urandom(nbytes)])
    rest = got[10:] if got[:1] == b"\xff" and got[9:10] == b"\x7f" else got
    return NO_REPLY if not rest else f"{len(rest)} bytes: {rest[:64]!r}"


async def raw_zmtp(address: str, message: list[bytes]) -> str:
    """What one ``message`` gets over ZMTP 3.0 spoken by hand, as a DEALER with the NULL
    mechanism: a CURVE listener ends the connection at the greeting, a NULL one takes the message
    (then only message frames back count, not the listener's own greeting and READY)."""
    body = b"".join(_frame(part, i < len(message) - 1) for i, part in enumerate(message))
    got = await _raw(address, [_GREETING, _command(b"READY", {b"Socket-Type": b"DEALER"}) + body])
    replies = _messages(got[64:])
    return NO_REPLY if not replies else f"reply: {replies!r:.200}"


async def _raw(address: str, sends: list[bytes]) -> bytes:
    """Everything a plain TCP connection receives in ``NO_REPLY_S`` while it sends ``sends`` (each
    after the previous one's 64 bytes back, as a ZMTP greeting waits for the peer's)."""
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    got = b""
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        async with asyncio.timeout(NO_REPLY_S):
            for i, data in enumerate(sends):
                writer.write(data)
                await writer.drain()
                while i < len(sends) - 1 and len(got) < 64 * (i + 1):
                    chunk = await reader.read(4096)
                    if not chunk:
                        return got
                    got += chunk
            while chunk := await reader.read(4096):
                got += chunk
    except (TimeoutError, ConnectionError):
        pass
    finally:
        writer.close()
    return got
