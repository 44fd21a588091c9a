"""Sessions: the receiving end of keyed tcp links, one session per connected sender.

A sender's connection is its ROUTER routing id. A frame from a routing id with no session is a
Hello (``accept`` decides) or dropped: a peer that has not proved an allowed client key gets no
reply and leaves nothing behind. A record that fails (bad tag, replayed, reordered) closes that
session for good: ``on_lost`` fails the transfers it was writing, and every later frame of the
connection is dropped (ZeroMQ gives a ROUTER no way to hang up one peer).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dsi.transport.kv.handshake import HELLO, MAGIC, SeenEphemerals, accept
from dsi.transport.kv.linkkeys import LinkKeys
from dsi.transport.kv.records import Opener, RecordRejected, Scratch, Sealer

log = logging.getLogger(__name__)

MAX_SESSIONS = 4096  # senders one receiver keeps sessions for; the least recently heard go first


@dataclass(slots=True)
class _Session:
    sealer: Sealer
    opener: Opener


@dataclass(slots=True)
class SessionCounts:
    """Counters of one receiving end since start."""

    accepted: int = 0  # handshakes completed
    refused: int = 0  # frames dropped: a Hello that proved nothing, or a frame of no session
    rejected: int = 0  # sessions closed for a record that failed


class Sessions:
    """The keyed receiving end of one Listener. ``send`` queues frames on its ROUTER."""

    def __init__(
        self,
        keys: LinkKeys,
        send: Callable[[list[Any]], None],
        on_lost: Callable[[bytes, str], None],
        limit: int = MAX_SESSIONS,
    ) -> None:
        if not keys.can_receive:
            raise ValueError("a keyed data plane receiver needs the server secret key ([security])")
        self._keys = keys
        self._send = send
        self._on_lost = on_lost
        self._limit = limit
        self._sessions: collections.OrderedDict[bytes, _Session] = collections.OrderedDict()
        self._seen = SeenEphemerals()
        self._scratch = Scratch()
        self.counts = SessionCounts()

    def receive(self, rid: bytes, frames: list[Any]) -> tuple[bytes, list[memoryview]] | None:
        """The header and payload of an authentic record from ``rid``; None when the frames were
        a handshake (answered here) or are dropped. Payload views are valid until the next call."""
        first = frames[0]
        if isinstance(first, bytes) and first[:5] == MAGIC + HELLO:
            self._hello(rid, first, len(frames))
            return None
        session = self._sessions.get(rid)
        if session is None:
            self.counts.refused += 1
            return None
        try:
            opened = session.opener.open(frames, self._scratch)
        except RecordRejected as error:
            self._close(rid, f"a record failed: {error}")
            self.counts.rejected += 1
            return None
        self._sessions.move_to_end(rid)
        return opened

    def seal(self, rid: bytes, header: bytes) -> list[Any] | None:
        """The frames (routing id first) of a reply to ``rid``; None when it has no session."""
        session = self._sessions.get(rid)
        if session is None:
            return None
        return [rid, *session.sealer.seal(header)]

    def _hello(self, rid: bytes, hello: bytes, nframes: int) -> None:
        accepted = accept(self._keys, hello, self._seen) if nframes == 1 else None
        if accepted is None:
            self.counts.refused += 1
            log.debug("kv data plane: a handshake that proves no allowed key, dropped")
            return
        welcome, keys = accepted
        if rid in self._sessions:  # the same connection starts over: its old session ends
            self._close(rid, "the sender started a new handshake")
        self._sessions[rid] = _Session(Sealer(keys.send), Opener(keys.receive))
        self.counts.accepted += 1
        while len(self._sessions) > self._limit:
            self._close(next(iter(self._sessions)), "too many senders: the least recently heard goes")
        self._send([rid, welcome])

    def _close(self, rid: bytes, why: str) -> None:
        del self._sessions[rid]
        log.warning("kv data plane: closed a sender's link: %s", why)
        self._on_lost(rid, why)
