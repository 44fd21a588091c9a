"""Address syntax: ZeroMQ endpoints (``tcp://HOST:PORT``, ``ipc://PATH``) and HTTP ``HOST:PORT``.

Parsers raise ValueError with the reason; the config reader adds the file and key.
"""

from __future__ import annotations

import ipaddress
import re

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_PORT = re.compile(r"[0-9]{1,5}")
_WILDCARDS = ("*", "0.0.0.0", "[::]")

ENDPOINT_FORMS = "tcp://HOST:PORT or ipc://PATH"


def parse_bind(text: str) -> str:
    """A ZeroMQ endpoint to bind; the host may be a wildcard (``*``, ``0.0.0.0``, ``[::]``)."""
    _check_endpoint(text, wildcard=True)
    return text


def parse_connect(text: str) -> str:
    """A ZeroMQ endpoint to connect to: a concrete host, never a wildcard."""
    _check_endpoint(text, wildcard=False)
    return text


def parse_host_port(text: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port) for an HTTP listener; an IPv6 host loses its brackets."""
    host, port = _split_host_port(text, "HOST:PORT")
    _check_host(host, wildcard=True, text=text)
    return host.strip("[]"), port


def endpoint_host(endpoint: str) -> str:
    """The host a tcp endpoint binds to (``127.0.0.1`` for ipc, which is local by nature).

    Raises ValueError for a wildcard host: other machines need a concrete name to reach it.
    """
    if endpoint.startswith("ipc://"):
        return "127.0.0.1"
    host, _ = _split_host_port(endpoint.removeprefix("tcp://"), ENDPOINT_FORMS)
    if host in _WILDCARDS:
        raise ValueError(f"missing required key (bind {endpoint!r} listens on every interface)")
    return host


def _check_endpoint(text: str, *, wildcard: bool) -> None:
    scheme, sep, rest = text.partition("://")
    if not sep or scheme not in ("tcp", "ipc"):
        raise ValueError(f"malformed endpoint {text!r}: expected {ENDPOINT_FORMS}")
    if scheme == "ipc":
        if not rest:
            raise ValueError(f"malformed endpoint {text!r}: ipc:// needs a path")
        return
    host, _ = _split_host_port(rest, ENDPOINT_FORMS, text)
    _check_host(host, wildcard=wildcard, text=text)


def _split_host_port(rest: str, forms: str, text: str | None = None) -> tuple[str, int]:
    text = text or rest
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not _PORT.fullmatch(port):
        raise ValueError(f"malformed address {text!r}: expected {forms}")
    number = int(port)
    if not 1 <= number <= 65535:
        raise ValueError(f"port must be in 1..65535, got {number} in {text!r}")
    return host, number


def _check_host(host: str, *, wildcard: bool, text: str) -> None:
    if host in _WILDCARDS:
        if not wildcard:
            raise ValueError(f"{text!r}: a wildcard host cannot be connected to")
        return
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"{text!r}: bad IPv6 address {host!r}") from None
        return
    if not _HOSTNAME.fullmatch(host):
        raise ValueError(f"{text!r}: bad host name {host!r}")
