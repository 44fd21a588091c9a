"""LinkKeys: a node's CURVE keys as the raw Curve25519 keys the data plane's tcp links use.

The control plane's keys (``[security]``, see dsi.transport.keyset) are Z85 text in ZeroMQ
certificate files; each decodes to 32 raw bytes, an X25519 key. The same server keypair, client
keypair and allow-list serve both planes, so a key set made by ``dsi keys create`` covers both.
"""

from __future__ import annotations

from dataclasses import dataclass

import zmq.auth
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from zmq.utils import z85

from dsi.transport.security import CurveKeys

KEY_BYTES = 32


@dataclass(frozen=True, slots=True)
class LinkKeys:
    """Raw keys of one node. Public keys are 32 bytes; secret keys are cryptography's objects."""

    server_public: bytes  # what every receiver proves it holds the secret of
    server_secret: X25519PrivateKey | None  # None on a node that only sends
    client_public: bytes  # what this node shows when it sends
    client_secret: X25519PrivateKey
    allowed: frozenset[bytes]  # client public keys a receiver admits (empty on a node that only sends)

    @classmethod
    def from_curve(cls, keys: CurveKeys) -> LinkKeys:
        """The raw form of ``keys``; the allow-list is read from ``keys.authorized_dir`` once, now
        (as the control plane's ZAP handler reads it once, at start)."""
        allowed: frozenset[bytes] = frozenset()
        if keys.authorized_dir is not None:
            found = zmq.auth.load_certificates(str(keys.authorized_dir))
            allowed = frozenset(_raw(k) for k in found)
        server_secret = None if keys.server_secret is None else _secret(keys.server_secret)
        return cls(_raw(keys.server_public), server_secret, _raw(keys.client_public),
                   _secret(keys.client_secret), allowed)  # fmt: skip

    @property
    def can_receive(self) -> bool:
        return self.server_secret is not None


def public_bytes(key: X25519PrivateKey | X25519PublicKey) -> bytes:
    """The 32 raw bytes of a public key (of a private key's public half)."""
    public = key.public_key() if isinstance(key, X25519PrivateKey) else key
    return public.public_bytes(Encoding.Raw, PublicFormat.Raw)


def _raw(z85_key: bytes | str) -> bytes:
    raw = z85.decode(z85_key)
    if len(raw) != KEY_BYTES:
        raise ValueError(f"a CURVE key decodes to {KEY_BYTES} bytes, not {len(raw)}")
    return raw


def _secret(z85_key: bytes) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(_raw(z85_key))
