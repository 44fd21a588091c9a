"""Base struct for every message on the control plane, and the messages every role understands.

Messages are ``msgspec.Struct`` subclasses tagged by class name and encoded as msgpack arrays
(``array_like``): field order is part of the wire format, so add new fields at the end with a
default. Each channel family lives in its own module and exports its union as ``<Family>Msg``.
"""

from __future__ import annotations

import msgspec

from dsi.messages.version import PROTOCOL_VERSION  # noqa: F401 (re-exported; the rule is there)


class Message(msgspec.Struct, tag=True, array_like=True, omit_defaults=True, gc=False, frozen=True):
    """Base of all control-plane messages; the tag is the class name."""


class Hello(Message):
    """First call on every new connection: who is calling and the newest protocol version it
    speaks. Hello, Welcome and ErrorInfo keep their layout in every version (see
    dsi.messages.version): they are how two versions find out about each other."""

    version: int
    peer_id: str
    role: str = ""


class Welcome(Message):
    """Reply to Hello: the server's identity and the protocol version the connection speaks (the
    lower of the caller's and the server's)."""

    version: int
    peer_id: str
    role: str = ""


class Ping(Message):
    """Liveness probe; answered with Pong by the runtime itself, never by a handler."""

    sent_ns: int = 0


class Pong(Message):
    sent_ns: int = 0


class Ack(Message):
    """Generic empty success reply."""


COMMON = (Hello, Welcome, Ping, Pong, Ack)
