"""Socket options shared by every control-plane socket.

Bounds (the documented backpressure chain): each socket queues at most ``HWM`` messages per
peer. A server's ROUTER drops replies to a peer whose queue is full (ZeroMQ semantics) - the
caller's ask then times out; a client's DEALER send waits while its queue is full, so a caller
that outruns a role slows down instead of growing memory. Inbox limits on the actor side answer
``Overloaded`` before the socket queues ever fill in normal operation.
"""

from __future__ import annotations

import zmq

HWM = 10_000
HEARTBEAT_IVL_MS = 1_000  # ZMTP pings on idle connections
HEARTBEAT_TIMEOUT_MS = 3_000  # a peer silent this long is disconnected
RECONNECT_IVL_MS = 100
RECONNECT_IVL_MAX_MS = 2_000


def tune(sock: zmq.Socket) -> None:
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, HWM)
    sock.setsockopt(zmq.RCVHWM, HWM)
    sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
    sock.setsockopt(zmq.HEARTBEAT_TTL, HEARTBEAT_TIMEOUT_MS)
    sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)


def bound_address(sock: zmq.Socket) -> str:
    """The endpoint actually bound (resolves ``tcp://127.0.0.1:*`` wildcards)."""
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)
