"""SSE writes on the wire: steps that arrive together leave in one HTTP chunk, a lone step leaves
at once, and HTTP/1.0 clients get the bytes unframed; the events are the same every way."""

import asyncio
import json

import pytest
from aiohttp.test_utils import TestServer

from dsi.recipe import ModelVersion, Recipe
from dsi.roles.entrypoint import sse
from dsi.roles.entrypoint.app import make_app
from dsi.roles.entrypoint.auth import ApiKeys
from dsi.roles.entrypoint.gateway import Gateway
from dsi.roles.entrypoint.metrics import Metrics
from dsi.roles.entrypoint.prepare import Preparer
from tests.roles.entrypoint.fakes import FakePool

TOKENS = 20


@pytest.fixture(scope="module")
def recipe():
    return Recipe({"dsi-tiny": ModelVersion.V4})


async def _raw_stream(recipe, pool: FakePool, version: str) -> tuple[bytes, bytes]:
    """(head, body) of one streamed Chat Completion read off a plain socket until it closes."""
    gateway = Gateway(pool, ApiKeys.load(None), Metrics(), Preparer(recipe, 16_384))
    server = TestServer(make_app(gateway, ["dsi-tiny"], 1 << 20), host="127.0.0.1")
    await server.start_server()
    try:
        body = json.dumps({"model": "dsi-tiny", "messages": [{"role": "user", "content": "hi"}],
                           "max_tokens": TOKENS, "stream": True}).encode()  # fmt: skip
        reader, writer = await asyncio.open_connection(server.host, server.port)
        writer.write(f"POST /v1/chat/completions HTTP/{version}\r\nHost: x\r\nConnection: close\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)  # fmt: skip
        raw = await asyncio.wait_for(reader.read(-1), 10)
        writer.close()
    finally:
        await server.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    return head, rest


def _chunks(body: bytes) -> list[bytes]:
    """The data of each HTTP/1.1 chunk, up to the terminating empty one."""
    out = []
    while True:
        size, _, body = body.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            assert body == b"\r\n"
            return out
        assert body[n : n + 2] == b"\r\n"
        out.append(body[:n])
        body = body[n + 2 :]


def _contents(events: bytes) -> list[str]:
    blocks = events.decode().split("\n\n")
    assert blocks[-2:] == ["data: [DONE]", ""]
    chunks = [json.loads(b.removeprefix("data: ")) for b in blocks[:-2]]
    return [c["choices"][0]["delta"].get("content", "") for c in chunks]


async def test_steps_that_arrive_together_share_a_chunk_and_a_lone_step_goes_at_once(recipe):
    head, together = await _raw_stream(recipe, FakePool(tokens=range(1000, 1000 + TOKENS)), "1.1")
    assert b"transfer-encoding: chunked" in head.lower()
    _, apart = await _raw_stream(recipe, FakePool(tokens=range(1000, 1000 + TOKENS), delay_s=0.005), "1.1")
    joined, spread = _chunks(together), _chunks(apart)
    # The fake engine yields every step without waiting: the first step goes out with the headers,
    # the rest with the end of the stream. Steps 5 ms apart each leave in their own chunk.
    assert len(joined) <= 3
    assert len(spread) >= TOKENS
    assert _contents(b"".join(joined)) == _contents(b"".join(spread))
    assert len(_contents(b"".join(joined))) == TOKENS + 1  # a step per token, then the finish chunk


async def test_an_http_1_0_client_gets_the_events_unframed(recipe):
    head, body = await _raw_stream(recipe, FakePool(tokens=range(1000, 1000 + TOKENS), delay_s=0.002), "1.0")
    assert b"transfer-encoding" not in head.lower()
    assert len(_contents(body)) == TOKENS + 1


class _GatedPool(FakePool):
    """Its first step waits until ``gate`` is set."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.gate = asyncio.Event()

    async def generate(self, msg, placement=None):
        await self.gate.wait()
        async for chunk in super().generate(msg, placement):
            yield chunk


async def test_the_headers_leave_alone_when_the_first_step_is_late(recipe, monkeypatch):
    monkeypatch.setattr(sse, "HEADERS_WAIT_S", 0.01)
    pool = _GatedPool(tokens=(1000, 1001))
    gateway = Gateway(pool, ApiKeys.load(None), Metrics(), Preparer(recipe, 16_384))
    server = TestServer(make_app(gateway, ["dsi-tiny"], 1 << 20), host="127.0.0.1")
    await server.start_server()
    try:
        body = json.dumps({"model": "dsi-tiny", "messages": [{"role": "user", "content": "hi"}],
                           "max_tokens": 2, "stream": True}).encode()  # fmt: skip
        reader, writer = await asyncio.open_connection(server.host, server.port)
        writer.write(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)  # fmt: skip
        # No step was generated yet, and the status is out.
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 200 OK") and not pool.requests
        pool.gate.set()
        rest = await asyncio.wait_for(reader.read(-1), 10)
        writer.close()
    finally:
        await server.close()
    assert _contents(b"".join(_chunks(rest)))[-1] == ""  # two steps, then the finish chunk
    assert len(_contents(b"".join(_chunks(rest)))) == 3
