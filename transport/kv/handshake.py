"""The tcp link handshake: both ends prove their CURVE keys and agree on fresh session keys.

Pure functions over bytes, no I/O. S is the cluster's server keypair (every receiver holds it),
C a client keypair whose public key is on the receiver's allow-list, e_c and e_s keys made for
this one connection and then dropped; DH is X25519, H is SHA-256::

    sender (client)                                      receiver (server)
    h1 = H(H(PROTOCOL | S) | e_c | C)
    k1 = HKDF(DH(e_c,S) | DH(C,S); salt h1)
    Hello: MAGIC H | e_c | C | GCM(k1, "", ad h1) ───►   C not allowed, e_c seen before, or a bad
                                                          tag: dropped, nothing answered or kept
                                                          h2 = H(h1 | tag1 | e_s)
                                                          c2s | s2c | k2 = HKDF(DH(e_c,S) | DH(C,S)
                                                                  | DH(e_s,e_c) | DH(e_s,C); salt h2)
                                              ◄───  Welcome: MAGIC W | e_s | GCM(k2, "", ad h2)
    a bad tag: the receiver does not hold S

Only the holder of C's secret can make a Hello's tag (DH(C,S)), only the holder of S's can make
a Welcome's (DH(e_c,S)); the session keys depend on DH(e_s,e_c), so they cannot be recomputed
from the static keys once both ephemerals are gone (forward secrecy). The transcript hashes bind
every public key exchanged (and the protocol name, so another version fails the first tag).
"""

from __future__ import annotations

import collections
import hashlib
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from dsi.transport.kv.linkkeys import KEY_BYTES, LinkKeys, public_bytes

PROTOCOL = b"dsi kv link 1: X25519, HKDF-SHA256, AES-256-GCM"
MAGIC = b"dkv\x01"  # first bytes of every frame of a keyed link (never a msgpack array)
HELLO, WELCOME, RECORD = b"H", b"W", b"R"
TAG_BYTES = 16
HELLO_BYTES = len(MAGIC) + 1 + 2 * KEY_BYTES + TAG_BYTES
WELCOME_BYTES = len(MAGIC) + 1 + KEY_BYTES + TAG_BYTES
SEEN_EPHEMERALS = 4096  # Hellos a receiver remembers to refuse a replayed one
_ZERO_NONCE = bytes(12)


class HandshakeFailed(Exception):
    """The peer did not prove the keys it had to."""


@dataclass(frozen=True, slots=True)
class SessionKeys:
    """AES-256-GCM keys of one connection, one per direction (32 bytes each)."""

    send: bytes
    receive: bytes


class SeenEphemerals:
    """The client ephemeral keys of the last ``limit`` accepted Hellos (a replay is refused)."""

    def __init__(self, limit: int = SEEN_EPHEMERALS) -> None:
        self._seen: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self._limit = limit

    def __contains__(self, key: bytes) -> bool:
        return key in self._seen

    def __len__(self) -> int:
        return len(self._seen)

    def add(self, key: bytes) -> None:
        self._seen[key] = None
        while len(self._seen) > self._limit:
            self._seen.popitem(last=False)


class ClientHandshake:
    """The sender's half: ``hello`` to send now, ``finish(welcome)`` for the session keys."""

    def __init__(self, keys: LinkKeys) -> None:
        self._keys = keys
        self._ephemeral = X25519PrivateKey.generate()
        server = X25519PublicKey.from_public_bytes(keys.server_public)
        e_c = public_bytes(self._ephemeral)
        self._h1 = _hash(_hash(PROTOCOL, keys.server_public), e_c, keys.client_public)
        self._static_dh = self._ephemeral.exchange(server) + keys.client_secret.exchange(server)
        self._tag1 = _tag(_hkdf(self._static_dh, self._h1, b"hello", 32), self._h1)
        self.hello = MAGIC + HELLO + e_c + keys.client_public + self._tag1

    def finish(self, welcome: bytes) -> SessionKeys:
        """Session keys (send = sender to receiver); HandshakeFailed unless the Welcome proves S."""
        if len(welcome) != WELCOME_BYTES or welcome[:5] != MAGIC + WELCOME:
            raise HandshakeFailed("not a Welcome")
        e_s_raw, tag2 = welcome[5 : 5 + KEY_BYTES], welcome[5 + KEY_BYTES :]
        try:
            e_s = X25519PublicKey.from_public_bytes(e_s_raw)
            dh = self._ephemeral.exchange(e_s) + self._keys.client_secret.exchange(e_s)
        except ValueError:  # a low-order point: an all-zero shared secret
            raise HandshakeFailed("a bad ephemeral key") from None
        h2 = _hash(self._h1, self._tag1, e_s_raw)
        okm = _hkdf(self._static_dh + dh, h2, b"session", 96)
        if not _verify(okm[64:], h2, tag2):
            raise HandshakeFailed("the receiver did not prove the cluster's server key")
        return SessionKeys(send=okm[:32], receive=okm[32:64])


def accept(keys: LinkKeys, hello: bytes, seen: SeenEphemerals) -> tuple[bytes, SessionKeys] | None:
    """The receiver's half: (the Welcome to send, session keys with send = receiver to sender),
    or None for a Hello that proves nothing (then nothing is kept: not even ``seen`` changes)."""
    if keys.server_secret is None:
        raise ValueError("a receiver needs the server secret key")
    if len(hello) != HELLO_BYTES or hello[:5] != MAGIC + HELLO:
        return None
    e_c_raw, c_raw = hello[5 : 5 + KEY_BYTES], hello[5 + KEY_BYTES : 5 + 2 * KEY_BYTES]
    tag1 = hello[5 + 2 * KEY_BYTES :]
    if c_raw not in keys.allowed or e_c_raw in seen:
        return None
    try:
        e_c, client = X25519PublicKey.from_public_bytes(e_c_raw), X25519PublicKey.from_public_bytes(c_raw)
        static_dh = keys.server_secret.exchange(e_c) + keys.server_secret.exchange(client)
    except ValueError:
        return None
    h1 = _hash(_hash(PROTOCOL, keys.server_public), e_c_raw, c_raw)
    if not _verify(_hkdf(static_dh, h1, b"hello", 32), h1, tag1):
        return None
    seen.add(e_c_raw)
    ephemeral = X25519PrivateKey.generate()
    e_s_raw = public_bytes(ephemeral)
    h2 = _hash(h1, tag1, e_s_raw)
    okm = _hkdf(static_dh + ephemeral.exchange(e_c) + ephemeral.exchange(client), h2, b"session", 96)
    welcome = MAGIC + WELCOME + e_s_raw + _tag(okm[64:], h2)
    return welcome, SessionKeys(send=okm[32:64], receive=okm[:32])


def _hash(*parts: bytes) -> bytes:
    return hashlib.sha256(b"".join(parts)).digest()


def _hkdf(secret: bytes, salt: bytes, info: bytes, length: int) -> bytes:
    return HKDF(hashes.SHA256(), length, salt, info).derive(secret)


def _tag(key: bytes, transcript: bytes) -> bytes:
    return AESGCM(key).encrypt(_ZERO_NONCE, b"", transcript)


def _verify(key: bytes, transcript: bytes, tag: bytes) -> bool:
    try:
        AESGCM(key).decrypt(_ZERO_NONCE, tag, transcript)
    except InvalidTag:
        return False
    return True
