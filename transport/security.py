"""CURVE authentication and encryption between roles.

Every role that binds uses the cluster's server keypair; every caller presents a client keypair
whose public key must be in ``authorized_dir``. A caller without the right keys never gets a
single reply: the ZAP handler refuses the handshake before any message reaches the role.
Keys are ZeroMQ certificate files, as ``dsi keys create`` writes them (dsi.transport.keyset).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.asyncio
import zmq.auth
from zmq.auth.asyncio import AsyncioAuthenticator

from dsi.transport.keyset import create_key_set


@dataclass(frozen=True, slots=True)
class CurveKeys:
    server_public: bytes
    server_secret: bytes | None  # None on processes that only call
    client_public: bytes
    client_secret: bytes
    authorized_dir: Path | None  # None on processes that only call

    @classmethod
    def load(
        cls,
        server_public_key: Path,
        client_secret_key: Path,
        server_secret_key: Path | None = None,
        authorized_keys_dir: Path | None = None,
    ) -> CurveKeys:
        server_public, _ = zmq.auth.load_certificate(server_public_key)
        client_public, client_secret = zmq.auth.load_certificate(client_secret_key)
        if client_secret is None:
            raise ValueError(f"{client_secret_key} holds no secret key")
        server_secret = None
        if server_secret_key is not None:
            _, server_secret = zmq.auth.load_certificate(server_secret_key)
            if server_secret is None:
                raise ValueError(f"{server_secret_key} holds no secret key")
        return cls(server_public, server_secret, client_public, client_secret, authorized_keys_dir)


def generate_keys(directory: Path) -> dict[str, Path]:
    """A key set with one client keypair, "client", under ``directory`` (see
    dsi.transport.keyset), as the paths of its files."""
    keyset = create_key_set(directory, ["client"])
    return {
        "server_public": keyset.server_public_file,
        "server_secret": keyset.server_secret_file,
        "client_public": keyset.authorized_dir / "client.key",
        "client_secret": keyset.client_secret_file("client"),
        "authorized_dir": keyset.authorized_dir,
    }


class Authenticator:
    """One ZAP handler per context, started before the first CURVE server binds."""

    def __init__(self, ctx: zmq.asyncio.Context, keys: CurveKeys) -> None:
        if keys.authorized_dir is None:
            raise ValueError("a CURVE server needs a directory of authorised client keys")
        self._auth = AsyncioAuthenticator(ctx)
        self._auth.start()
        self._auth.configure_curve(domain="*", location=str(keys.authorized_dir))

    def stop(self) -> None:
        self._auth.stop()


def secure_server(sock: zmq.Socket, keys: CurveKeys | None) -> None:
    if keys is None:
        return
    if keys.server_secret is None:
        raise ValueError("this process has no server secret key but binds a CURVE socket")
    sock.curve_secretkey = keys.server_secret
    sock.curve_publickey = keys.server_public
    sock.curve_server = True


def secure_client(sock: zmq.Socket, keys: CurveKeys | None) -> None:
    if keys is None:
        return
    sock.curve_serverkey = keys.server_public
    sock.curve_publickey = keys.client_public
    sock.curve_secretkey = keys.client_secret
