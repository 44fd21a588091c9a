"""A cluster's CURVE key set on disk, as ``dsi keys create`` writes it and ``[security]`` reads it.

    DIR/
      server.key                the server public key (every role binds with the one server keypair)
      server.key_secret         the server keypair
      clients/NAME.key_secret   one client keypair per name (a host, a role kind, the operator)
      authorized/NAME.key       the allow-list: the client public keys a role admits
    every file 0600, the folders 0700; keys are Z85 text in ZeroMQ certificate files

A node's ``[security]`` names the server pair, one client pair and the allow-list (``snippet``).
To shut a client out, delete its ``authorized/NAME.key`` on every host and restart the roles.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth

DEFAULT_CLIENTS = ("cluster",)
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")
_PUBLIC_BANNER = "#   ZeroMQ CURVE Public Certificate (dsi keys create)\n\n"
_SECRET_BANNER = (
    "#   ZeroMQ CURVE **Secret** Certificate (dsi keys create)\n"
    "#   Keep it 0600; give it to no one but the hosts of this cluster.\n\n"
)


class KeySetError(Exception):
    """A key set that cannot be written or read; the message says why and what to do."""


@dataclass(slots=True, frozen=True)
class ClientKey:
    """One client keypair of a key set: its name, its Z85 public key, whether roles admit it."""

    name: str
    public: bytes
    authorized: bool


@dataclass(slots=True, frozen=True)
class KeySet:
    """The public side of a key set in ``directory`` (absolute)."""

    directory: Path
    server_public: bytes
    clients: tuple[ClientKey, ...]
    extra_authorized: tuple[tuple[str, bytes], ...] = ()  # allow-list files with no client pair here

    @property
    def server_public_file(self) -> Path:
        return self.directory / "server.key"

    @property
    def server_secret_file(self) -> Path:
        return self.directory / "server.key_secret"

    @property
    def authorized_dir(self) -> Path:
        return self.directory / "authorized"

    def client_secret_file(self, name: str) -> Path:
        return self.directory / "clients" / f"{name}.key_secret"

    def snippet(self, client: str | None = None) -> str:
        """The ``[security]`` section that uses this set, with ``client``'s keypair (default: the
        first client)."""
        names = [c.name for c in self.clients]
        if not names:
            raise KeySetError(f"{self.directory} holds no client keypair (clients/NAME.key_secret)")
        chosen = client if client is not None else names[0]
        if chosen not in names:
            raise KeySetError(f"{self.directory} has no client {chosen!r}; it has {', '.join(names)}")
        others = [n for n in names if n != chosen]
        lines = [f"# CURVE keys of {self.directory}: the same folder, at the same path, on every host."]
        if others:
            lines.append(f"# Other client keypairs for client_secret_key: {', '.join(others)}.")
        lines += [
            "[security]",
            "curve = true",
            f"server_secret_key = {_toml(self.server_secret_file)}",
            f"server_public_key = {_toml(self.server_public_file)}",
            f"client_secret_key = {_toml(self.client_secret_file(chosen))}",
            f"authorized_keys_dir = {_toml(self.authorized_dir)}",
        ]
        return "\n".join(lines) + "\n"


def create_key_set(directory: Path, clients: Sequence[str] = DEFAULT_CLIENTS, force: bool = False) -> KeySet:
    """Write a new key set into ``directory`` (made if absent): a server keypair, one client
    keypair per name of ``clients``, each of them authorised. An existing set is replaced only
    with ``force`` (its files, and only they, are removed first)."""
    _check_names(clients)
    directory = directory.expanduser().absolute()
    if directory.exists() and not directory.is_dir():
        raise KeySetError(f"{directory} is not a directory")
    present = _key_files(directory)
    if present and not force:
        listed = ", ".join(str(p.relative_to(directory)) for p in present[:4])
        raise KeySetError(f"{directory} already holds keys ({listed}); pass --force to replace them")
    for path in present:
        path.unlink()
    made = [f for f in (directory, directory / "clients", directory / "authorized") if not f.exists()]
    for folder in made:
        folder.mkdir(parents=True)
        folder.chmod(0o700)  # an existing DIR keeps its mode: it may be the operator's own folder
    server_public, server_secret = zmq.curve_keypair()
    _write(directory / "server.key", _PUBLIC_BANNER, server_public)
    _write(directory / "server.key_secret", _SECRET_BANNER, server_public, server_secret)
    for name in clients:
        public, secret = zmq.curve_keypair()
        _write(directory / "clients" / f"{name}.key_secret", _SECRET_BANNER, public, secret)
        _write(directory / "authorized" / f"{name}.key", _PUBLIC_BANNER, public)
    return load_key_set(directory)


def load_key_set(directory: Path) -> KeySet:
    """The public side of the key set in ``directory``; KeySetError when it holds none."""
    directory = directory.expanduser().absolute()
    server = directory / "server.key"
    if not server.is_file() or not (directory / "server.key_secret").is_file():
        raise KeySetError(f"{directory} holds no key set; make one with: dsi keys create --out {directory}")
    allowed = {p.stem: _public(p) for p in sorted((directory / "authorized").glob("*.key")) if p.is_file()}
    allowed_keys = set(allowed.values())
    clients = tuple(
        ClientKey(p.name.removesuffix(".key_secret"), public, public in allowed_keys)
        for p in sorted((directory / "clients").glob("*.key_secret"))
        for public in (_public(p, secret=True),)
    )
    mine = {c.public for c in clients}
    extra = tuple((name, key) for name, key in allowed.items() if key not in mine)
    return KeySet(directory, _public(server), clients, extra)


def _check_names(clients: Sequence[str]) -> None:
    if not clients:
        raise KeySetError("a key set needs at least one client name")
    for name in clients:
        if not _NAME.fullmatch(name):
            raise KeySetError(f"client name {name!r}: use letters, digits, '_', '.' or '-'")
    duplicates = sorted({n for n in clients if list(clients).count(n) > 1})
    if duplicates:
        raise KeySetError(f"client names repeat: {', '.join(duplicates)}")


def _key_files(directory: Path) -> list[Path]:
    """The files of a key set in ``directory`` (what --force replaces)."""
    if not directory.is_dir():
        return []
    found = [directory / n for n in ("server.key", "server.key_secret") if (directory / n).exists()]
    found += sorted((directory / "clients").glob("*.key_secret"))
    found += sorted((directory / "authorized").glob("*.key"))
    return found


def _write(path: Path, banner: str, public: bytes, secret: bytes | None = None) -> None:
    """A ZeroMQ certificate file, created 0600 (never readable by others, not even briefly)."""
    text = banner + "metadata\ncurve\n" + f'    public-key = "{public.decode()}"\n'
    if secret is not None:
        text += f'    secret-key = "{secret.decode()}"\n'
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _public(path: Path, secret: bool = False) -> bytes:
    try:
        public, secret_key = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise KeySetError(f"{path}: not a ZeroMQ certificate ({exc})") from None
    if secret and secret_key is None:
        raise KeySetError(f"{path} holds no secret key")
    return public


def _toml(path: Path) -> str:
    """``path`` as a TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(str(path), ensure_ascii=False)
