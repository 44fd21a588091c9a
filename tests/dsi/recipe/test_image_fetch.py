"""Image URL fetching: internal addresses refused after resolution, the checked address the one
connected to, size and time limits. No network: names resolve through a patched resolver, and
the one server is a local HTTP server on 127.0.0.1 (refused unless a test allows it)."""

from __future__ import annotations

import ipaddress
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dsi.model.vit import TINY_VISION
from dsi.recipe.errors import RequestError
from dsi.recipe.image_fetch import FetchLimits, ImageFetchError, fetch_image, refusal
from dsi.recipe.images import ImageLimits, decode_image
from tests.images import png_bytes

PNG = png_bytes(64, 48)
LOCAL = (ipaddress.ip_network("127.0.0.1/32"),)


@dataclass
class ImageServer:
    """What the local server saw: one (path, Host header) per request."""

    port: int
    seen: list[tuple[str, str]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"


def _handler(state: ImageServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.seen.append((self.path, self.headers.get("Host", "")))
            if self.path == "/img.png":
                self._send(200, PNG)
            elif self.path == "/big":
                self._send(200, b"x" * 5000)
            elif self.path == "/big-unsized":  # no Content-Length: the body ends at the close
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"x" * 5000)
                self.close_connection = True
            elif self.path == "/slow":  # headers, then nothing until the test ends
                self.send_response(200)
                self.send_header("Content-Length", "100")
                self.end_headers()
                self.wfile.write(b"x")
                self.wfile.flush()
                state.release.wait(10)
            elif self.path.startswith("/to/"):
                self.send_response(302)
                self.send_header("Location", self.path[len("/to") :].replace("/_", "http://", 1))
                self.send_header("Content-Length", "0")
                self.end_headers()
            else:
                self._send(404, b"no such image")

        def _send(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@pytest.fixture
def server() -> Iterator[ImageServer]:
    state = ImageServer(0)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    httpd.daemon_threads = True
    state.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state.release.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def names(table: dict[str, list[str]]):
    """A resolver over ``table`` (host -> addresses) that records the hosts it was asked for."""
    asked: list[str] = []

    def resolve(host: str, port: int) -> list[str]:
        asked.append(host)
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return table[host]

    resolve.asked = asked  # type: ignore[attr-defined]
    return resolve


REFUSED = {
    "127.0.0.1": "loopback",
    "127.8.9.10": "loopback",
    "::1": "loopback",
    "10.1.2.3": "private",
    "172.16.0.1": "private",
    "192.168.1.1": "private",
    "fc00::1": "private",
    "169.254.169.254": "link-local",
    "fe80::1": "link-local",
    "0.0.0.0": "unspecified",
    "::": "unspecified",
    "224.0.0.1": "multicast",
    "ff02::1": "multicast",
    "240.0.0.1": "reserved",
    "100.64.0.1": "not globally routable",
    "::ffff:127.0.0.1": "loopback address inside an IPv6",
    "::ffff:10.0.0.1": "private address inside an IPv6",
    "::ffff:169.254.169.254": "link-local address inside an IPv6",
    "2002:7f00:1::": "loopback address inside an IPv6",  # 6to4 of 127.0.0.1
    "64:ff9b::a9fe:a9fe": "link-local address inside an IPv6",  # NAT64 of 169.254.169.254
}


@pytest.mark.parametrize("text", sorted(REFUSED))
def test_internal_addresses_are_refused(text):
    why = refusal(ipaddress.ip_address(text))
    assert why is not None and REFUSED[text] in why


@pytest.mark.parametrize("text", ["93.184.216.34", "8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8"])
def test_public_addresses_are_not_refused(text):
    assert refusal(ipaddress.ip_address(text)) is None


def test_an_allowed_network_is_not_refused():
    allow = (ipaddress.ip_network("10.20.0.0/16"),)
    assert refusal(ipaddress.ip_address("10.20.3.4"), allow) is None
    assert refusal(ipaddress.ip_address("::ffff:10.20.3.4"), allow) is None
    assert refusal(ipaddress.ip_address("10.21.0.1"), allow) is not None


def test_a_local_server_is_refused_by_default_and_never_asked(server):
    limits = ImageLimits(allow_fetch=True, fetch_timeout_s=5.0)
    with pytest.raises(RequestError) as err:
        decode_image(server.url("/img.png"), TINY_VISION, limits, "image[0]")
    assert (err.value.status, err.value.api_code, err.value.param) == (400, "invalid_image", "image[0]")
    assert "127.0.0.1, a loopback address" in str(err.value)
    assert server.seen == []


def test_a_name_is_checked_after_resolution(monkeypatch, server):
    real = socket.getaddrinfo

    def fake(host, port, *args, **kwargs):
        if host == "images.example":
            return real("127.0.0.1", port, *args, **kwargs)
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    limits = ImageLimits(allow_fetch=True, fetch_timeout_s=5.0)
    with pytest.raises(
        RequestError, match=re.escape("images.example resolves to 127.0.0.1, a loopback address")
    ):
        decode_image(server.url("/img.png", "images.example"), TINY_VISION, limits, "image[0]")
    assert server.seen == []


def test_one_internal_address_among_public_ones_refuses_the_name():
    resolve = names({"cdn.example": ["93.184.216.34", "10.0.0.7"]})
    with pytest.raises(ImageFetchError, match=re.escape("resolves to 10.0.0.7, a private address")):
        fetch_image("http://cdn.example/a.png", FetchLimits(1000, 5.0), resolve)


def test_the_checked_address_is_the_one_connected_to(monkeypatch, server):
    """The name resolves once: a second answer (a rebinding DNS server's) is never used."""
    real = socket.getaddrinfo
    answers = iter(["127.0.0.1", "10.255.255.1"])
    asked: list[str] = []

    def rebinding(host, port, *args, **kwargs):
        asked.append(host)
        if host == "images.example":
            return real(next(answers), port, *args, **kwargs)
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    limits = ImageLimits(allow_fetch=True, fetch_timeout_s=5.0, fetch_allow=LOCAL)
    image = decode_image(server.url("/img.png", "images.example"), TINY_VISION, limits, "image[0]")
    assert (image.height, image.width) == (56, 56)
    assert asked.count("images.example") == 1
    assert server.seen == [("/img.png", f"images.example:{server.port}")]


def test_an_allowed_network_is_fetched(server):
    assert fetch_image(server.url("/img.png"), FetchLimits(1 << 20, 5.0, LOCAL)) == PNG


@pytest.mark.parametrize("path", ["/big", "/big-unsized"])
def test_a_body_over_the_size_limit_is_refused(server, path):
    with pytest.raises(ImageFetchError, match="larger than 1000 bytes"):
        fetch_image(server.url(path), FetchLimits(1000, 5.0, LOCAL))


def test_a_server_that_stalls_is_given_up_at_the_time_limit(server):
    start = time.monotonic()
    with pytest.raises(ImageFetchError, match=re.escape("within 0.5 s")):
        fetch_image(server.url("/slow"), FetchLimits(1000, 0.5, LOCAL))
    assert time.monotonic() - start < 3.0


def test_a_resolver_that_hangs_is_given_up_at_the_time_limit():
    release = threading.Event()

    def hanging(host: str, port: int) -> list[str]:
        release.wait(10)
        return ["93.184.216.34"]

    start = time.monotonic()
    try:
        with pytest.raises(ImageFetchError, match="did not resolve in time"):
            fetch_image("http://slow-dns.example/a.png", FetchLimits(1000, 0.3), hanging)
    finally:
        release.set()
    assert time.monotonic() - start < 3.0


def test_a_redirect_is_checked_like_the_first_url(server):
    resolve = names({"127.0.0.1": ["127.0.0.1"], "internal.example": ["10.0.0.1"]})
    to_internal = server.url("/to/_internal.example/secret")
    with pytest.raises(
        ImageFetchError, match=re.escape("internal.example resolves to 10.0.0.1, a private address")
    ):
        fetch_image(to_internal, FetchLimits(1 << 20, 5.0, LOCAL), resolve)
    to_image = server.url(f"/to/_127.0.0.1:{server.port}/img.png")
    assert fetch_image(to_image, FetchLimits(1 << 20, 5.0, LOCAL), resolve) == PNG
    assert [path for path, _ in server.seen] == [
        "/to/_internal.example/secret",
        "/to/_127.0.0.1:" + str(server.port) + "/img.png",
        "/img.png",
    ]


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://nowhere.example/a.png", "does not resolve"),
        ("ftp://files.example/a.png", "must be http or https"),
        ("http://user:pw@images.example/a.png", "must not carry credentials"),
        ("http://images.example:99999/a.png", "malformed"),
    ],
)
def test_unusable_urls_are_refused(url, reason):
    with pytest.raises(ImageFetchError, match=reason):
        fetch_image(url, FetchLimits(1000, 5.0), names({}))


def test_an_error_status_is_refused(server):
    with pytest.raises(ImageFetchError, match="HTTP 404"):
        fetch_image(server.url("/missing.png"), FetchLimits(1000, 5.0, LOCAL))
