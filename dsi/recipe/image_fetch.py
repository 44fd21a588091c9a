"""Fetching an image URL without reaching into the server's own network.

    url --http(s), a host, no credentials--> host, port
        --resolve (getaddrinfo in a helper thread, within the deadline)--> addresses
        --every address public (or inside an allowed network)--> connect to a checked address;
          the Host header and the TLS server name stay the URL's host, and nothing resolves
          the name a second time (a DNS answer cannot change between check and connect)
        --status 200, Content-Length and body <= max_bytes, all within timeout_s--> bytes
    a redirect (301, 302, 303, 307, 308) is a new URL, checked the same way, at most
    MAX_REDIRECTS times; the deadline covers them all.

Refused addresses: loopback, private, link-local, multicast, reserved, unspecified, shared
(carrier-grade NAT) and every other address that is not globally routable, an IPv6 address
that embeds one of those (IPv4-mapped, NAT64, 6to4, Teredo) included. ``allow`` names networks
that are fetched from although they are not public (a private deployment's image host; tests).

``fetch_image`` blocks: the gateway runs the request's preparation in a worker thread when
image fetching is on (see dsi.roles.entrypoint.gateway).
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Sequence[str]]
"""(host, port) -> the host's addresses as text; raises OSError when the name does not resolve."""

MAX_REDIRECTS = 3
_REDIRECTS = (301, 302, 303, 307, 308)
_CHUNK = 64 << 10  # bytes read at a time
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # the well-known prefix: an IPv4 address in its low 32 bits


class ImageFetchError(Exception):
    """Why an image URL was not fetched; the message is for the client."""


@dataclass(slots=True, frozen=True)
class FetchLimits:
    """``max_bytes``: of the body; ``timeout_s``: for everything (resolution, connection,
    redirects, body); ``allow``: networks fetched from although not public."""

    max_bytes: int
    timeout_s: float
    allow: tuple[IPNetwork, ...] = ()


@dataclass(slots=True, frozen=True)
class _Target:
    https: bool
    host: str
    port: int
    path: str  # path and query, as sent in the request line


def system_resolve(host: str, port: int) -> list[str]:
    """The addresses ``getaddrinfo`` gives for ``host`` (TCP), in its order, without repeats."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def refusal(address: IPAddress, allow: Sequence[IPNetwork] = ()) -> str | None:
    """Why ``address`` must not be fetched from ("a loopback address", ...), or None."""
    inner = _embedded_v4(address)
    for ip in (address,) if inner is None else (address, inner):
        if any(ip.version == net.version and ip in net for net in allow):
            return None
    if inner is not None:
        why = refusal(inner)
        return None if why is None else f"{why} inside an IPv6 address"
    kinds = (
        (address.is_unspecified, "an unspecified address"),
        (address.is_loopback, "a loopback address"),
        (address.is_link_local, "a link-local address"),
        (address.is_multicast, "a multicast address"),
        (address.is_reserved, "a reserved address"),
        (address.is_private, "a private address"),
        (not address.is_global, "an address that is not globally routable"),
    )
    return next((why for hit, why in kinds if hit), None)


def fetch_image(url: str, limits: FetchLimits, resolve: Resolver = system_resolve) -> bytes:
    """The body of ``url`` (at most ``limits.max_bytes``). Raises ImageFetchError."""
    deadline = time.monotonic() + limits.timeout_s
    for _ in range(MAX_REDIRECTS + 1):
        target = _target(url)
        addresses = _checked(target, limits, resolve, deadline)
        conn = _connect(target, addresses, deadline, limits.timeout_s)
        sock = conn.sock  # the response keeps reading it after the connection lets it go
        # Per-read socket timeouts do not bound a server that trickles bytes; at the deadline
        # the watchdog shuts the socket, which ends any read in progress.
        watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), _cut, (sock,))
        watchdog.start()
        try:
            resp = _get(conn, sock, target, deadline, limits.timeout_s)
            if resp.status in _REDIRECTS:
                location = resp.getheader("Location")
                if not location:
                    raise ImageFetchError(f"the image URL answered HTTP {resp.status} without a Location")
                url = urljoin(url, location)
                continue
            if resp.status != 200:
                raise ImageFetchError(f"the image URL answered HTTP {resp.status} {resp.reason}".rstrip())
            return _body(sock, resp, limits, deadline)
        finally:
            watchdog.cancel()
            conn.close()
    raise ImageFetchError(f"the image URL redirected more than {MAX_REDIRECTS} times")


def _target(url: str) -> _Target:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ImageFetchError(f"the image URL is malformed: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise ImageFetchError(f"an image URL must be http or https, not {parts.scheme or 'schemeless'}")
    if not parts.hostname:
        raise ImageFetchError("the image URL has no host")
    if parts.username is not None or parts.password is not None:
        raise ImageFetchError("an image URL must not carry credentials")
    https = parts.scheme == "https"
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return _Target(https, parts.hostname, port or (443 if https else 80), path)


def _checked(target: _Target, limits: FetchLimits, resolve: Resolver, deadline: float) -> list[str]:
    """The addresses of ``target.host``; ImageFetchError when any of them is refused (a name
    with one internal address among public ones is refused as a whole)."""
    texts = _resolve_by(target.host, target.port, resolve, deadline)
    if not texts:
        raise ImageFetchError(f"the image URL's host {target.host} has no address")
    for text in texts:
        try:
            address = ipaddress.ip_address(text)
        except ValueError:
            raise ImageFetchError(f"the image URL's host {target.host} resolved to {text!r}") from None
        why = refusal(address, limits.allow)
        if why is not None:
            raise ImageFetchError(
                f"the image URL's host {target.host} resolves to {address}, {why}; "
                "this server fetches images from public addresses only"
            )
    return texts


def _resolve_by(host: str, port: int, resolve: Resolver, deadline: float) -> list[str]:
    """``resolve(host, port)`` in a helper thread, given up at the deadline (a resolver call
    cannot be cancelled: the thread finishes on its own)."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="dsi-image-resolve")
    try:
        return list(pool.submit(resolve, host, port).result(timeout=max(0.0, deadline - time.monotonic())))
    except TimeoutError:
        raise ImageFetchError(f"the image URL's host {host} did not resolve in time") from None
    except OSError as exc:
        raise ImageFetchError(f"the image URL's host {host} does not resolve: {exc}") from None
    finally:
        pool.shutdown(wait=False)


def _connect(
    target: _Target, addresses: list[str], deadline: float, timeout_s: float
) -> http.client.HTTPConnection:
    """A connection to the first of ``addresses`` that accepts one."""
    failure: OSError | None = None
    for address in addresses:
        cls = http.client.HTTPSConnection if target.https else http.client.HTTPConnection
        conn = cls(target.host, target.port, timeout=_left(deadline, timeout_s))

        def pinned(_hostport, timeout, source=None, address=address):  # type: ignore[no-untyped-def]
            return socket.create_connection((address, target.port), timeout, source)

        # http.client opens its socket through this attribute; the pinned address keeps the
        # Host header and the TLS name of the URL while connecting to the address checked.
        conn._create_connection = pinned  # type: ignore[attr-defined]
        try:
            conn.connect()
            return conn
        except TimeoutError:
            conn.close()
            raise ImageFetchError(
                f"the image URL's host did not accept a connection within {timeout_s:g} s"
            ) from None
        except OSError as exc:
            conn.close()
            failure = exc
    raise ImageFetchError(f"the image URL's host {target.host} could not be reached: {failure}")


def _get(
    conn: http.client.HTTPConnection, sock: socket.socket, target: _Target, deadline: float, timeout_s: float
) -> http.client.HTTPResponse:
    try:
        sock.settimeout(_left(deadline, timeout_s))
        conn.request("GET", target.path, headers={"Accept": "image/*", "User-Agent": "dsi-gateway"})
        return conn.getresponse()
    except (OSError, http.client.HTTPException) as exc:
        raise _failed("the image URL could not be fetched", exc, deadline, timeout_s) from None


def _body(sock: socket.socket, resp: http.client.HTTPResponse, limits: FetchLimits, deadline: float) -> bytes:
    declared = resp.getheader("Content-Length")
    if declared is not None and declared.isdigit() and int(declared) > limits.max_bytes:
        raise ImageFetchError(f"the image is larger than {limits.max_bytes} bytes")
    body = bytearray()
    try:
        while len(body) <= limits.max_bytes:
            sock.settimeout(_left(deadline, limits.timeout_s))
            chunk = resp.read1(min(_CHUNK, limits.max_bytes + 1 - len(body)))
            if not chunk:
                _left(deadline, limits.timeout_s)  # an end cut by the watchdog is no end
                return bytes(body)
            body += chunk
    except (OSError, http.client.HTTPException) as exc:
        raise _failed("the image could not be read", exc, deadline, limits.timeout_s) from None
    raise ImageFetchError(f"the image is larger than {limits.max_bytes} bytes")


def _failed(what: str, exc: Exception, deadline: float, timeout_s: float) -> ImageFetchError:
    """The error for ``exc``: the time limit's once the deadline has passed (the watchdog's
    shutdown shows as a reset or a short read), else ``what`` and ``exc``."""
    if isinstance(exc, TimeoutError) or time.monotonic() >= deadline:
        return ImageFetchError(f"the image was not received within {timeout_s:g} s")
    return ImageFetchError(f"{what}: {exc}")


def _cut(sock: socket.socket | None) -> None:
    """Shut ``sock`` for reading and writing (the plain socket's call, under TLS too)."""
    if sock is None:
        return
    with contextlib.suppress(OSError):  # already closed
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _left(deadline: float, timeout_s: float) -> float:
    """Seconds to the deadline; ImageFetchError once it has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise ImageFetchError(f"the image was not received within {timeout_s:g} s")
    return left


def _embedded_v4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (IPv4-mapped, NAT64, 6to4, Teredo client), or None."""
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return address.sixtofour
    return address.teredo[1] if address.teredo is not None else None
