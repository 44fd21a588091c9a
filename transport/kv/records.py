"""Sealed records: every message of a keyed tcp link, AES-256-GCM with per-direction counters.

One message (a header and its payload parts) becomes one or two frames::

    frame 0   MAGIC R | counter: u64 | payload bytes n: u64 | GCM(header) | tag    nonce = counter
    frame 1   GCM(payload parts, concatenated) | tag  (only when n > 0)          nonce = counter + 1

Both tags cover the 21 clear bytes of frame 0 as associated data. A nonce is 4 zero bytes and the
8-byte counter; each direction of a connection has its own key and its own counter, which only
grows, so no (key, nonce) pair is ever used twice. A receiver takes a record only with a counter
above the last one it took (a replayed, reordered or forged record is rejected), and verifies
every tag before a single byte is handed on.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from dsi.transport.kv.handshake import MAGIC, RECORD, TAG_BYTES

_HEAD = struct.Struct(">4scQQ")  # magic, kind, counter, payload bytes
HEAD_BYTES = _HEAD.size
COUNTER_LIMIT = 1 << 63  # a link is closed long before; nonces never wrap


class RecordRejected(Exception):
    """A frame that is not the next authentic record of this connection."""


def _nonce(counter: int) -> bytes:
    return counter.to_bytes(12, "big")


class Sealer:
    """The sending direction of one connection."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._aead = AESGCM(key)
        self.counter = 0  # the next nonce

    def seal(self, header: bytes, payload: Sequence[memoryview] = ()) -> list[Any]:
        """Frames for ``header`` and the concatenation of ``payload`` (byte views; not kept)."""
        n = sum(p.nbytes for p in payload)
        counter = self.counter
        self.counter += 2 if n else 1
        if self.counter >= COUNTER_LIMIT:
            raise RecordRejected("the link's counter is used up")
        head = _HEAD.pack(MAGIC, RECORD, counter, n)
        frames: list[Any] = [head + self._aead.encrypt(_nonce(counter), header, head)]
        if n:
            frames.append(self._seal_payload(_nonce(counter + 1), head, payload, n))
        return frames

    def _seal_payload(self, nonce: bytes, head: bytes, payload: Sequence[memoryview], n: int) -> np.ndarray:
        """[n + 16] uint8: the parts encrypted straight into one new buffer (no copy before)."""
        out = np.empty(n + TAG_BYTES, np.uint8)
        view = memoryview(out)
        encryptor = Cipher(algorithms.AES(self._key), modes.GCM(nonce)).encryptor()
        encryptor.authenticate_additional_data(head)
        at = 0
        for part in payload:  # update_into needs 15 bytes of room past the part: the tag's
            at += encryptor.update_into(part, view[at:])
        encryptor.finalize()
        if at != n:
            raise RuntimeError(f"sealed {at} of {n} payload bytes")
        view[n:] = encryptor.tag
        return out


class Opener:
    """The receiving direction of one connection."""

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)
        self.last = -1  # the highest nonce taken

    def open(self, frames: Sequence[Any], scratch: Scratch) -> tuple[bytes, list[memoryview]]:
        """(header, payload): payload is [] or one view into ``scratch`` (valid until its next use).
        RecordRejected for anything but the next authentic record; then nothing has changed."""
        first = _bytes(frames[0])
        if len(first) < HEAD_BYTES + TAG_BYTES:
            raise RecordRejected("a frame too short for a record")
        magic, kind, counter, n = _HEAD.unpack_from(first)
        if magic != MAGIC or kind != RECORD:
            raise RecordRejected("not a record")
        if counter <= self.last or counter + 1 >= COUNTER_LIMIT:
            raise RecordRejected(f"record {counter} after {self.last}: replayed or reordered")
        if len(frames) != (2 if n else 1):
            raise RecordRejected("a record's frame count does not match its payload size")
        head = first[:HEAD_BYTES]
        try:
            header = self._aead.decrypt(_nonce(counter), first[HEAD_BYTES:], head)
            payload: list[memoryview] = []
            if n:
                sealed = _view(frames[1])
                if sealed.nbytes != n + TAG_BYTES:
                    raise RecordRejected("a payload frame of the wrong size")
                out = scratch.view(n)
                self._aead.decrypt_into(_nonce(counter + 1), sealed, head, out)
                payload = [out]
        except InvalidTag:
            raise RecordRejected(f"record {counter}: authentication failed") from None
        self.last = counter + (1 if n else 0)
        return header, payload


class Scratch:
    """A receive buffer reused for every payload one end opens (grown as needed, never shrunk)."""

    def __init__(self) -> None:
        self._buffer = np.empty(0, np.uint8)

    def view(self, nbytes: int) -> memoryview:
        if self._buffer.nbytes < nbytes:
            self._buffer = np.empty(nbytes, np.uint8)
        return memoryview(self._buffer)[:nbytes]


def _bytes(frame: Any) -> bytes:
    return frame if isinstance(frame, bytes) else bytes(_view(frame))


def _view(frame: Any) -> memoryview:
    return frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
