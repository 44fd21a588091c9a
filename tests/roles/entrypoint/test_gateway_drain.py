"""A draining gateway over a fake engine pool: /health and new requests 503 at once, in the
client's protocol, while a stream in flight finishes whole; the wait is bounded."""

import asyncio
import time

from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from dsi.recipe import ModelVersion, Recipe
from dsi.roles.entrypoint.app import make_app
from dsi.roles.entrypoint.auth import ApiKeys
from dsi.roles.entrypoint.gateway import Gateway
from dsi.roles.entrypoint.metrics import Metrics
from dsi.roles.entrypoint.prepare import Preparer
from tests.roles.entrypoint.fakes import FakePool

CHAT = {
    "model": "dsi-tiny",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 10,
    "stream": True,
}
MESSAGES = {"model": "dsi-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


async def _server(pool: FakePool) -> tuple[TestServer, Gateway]:
    recipe = Recipe({"dsi-tiny": ModelVersion.V4})
    gateway = Gateway(pool, ApiKeys.load(None), Metrics(), Preparer(recipe, 16_384))
    server = TestServer(make_app(gateway, ["dsi-tiny"], 1 << 20, worker="e"), host="127.0.0.1")
    await server.start_server()
    return server, gateway


async def test_a_stream_in_flight_finishes_while_everything_new_is_refused():
    server, gateway = await _server(FakePool(tokens=range(1000, 1010), delay_s=0.1))
    async with ClientSession() as http:
        stream = await http.post(server.make_url("/v1/chat/completions"), json=CHAT)
        assert stream.status == 200
        await stream.content.readuntil(b"\n\n")  # the first event: in flight
        drained = asyncio.ensure_future(gateway.drain(10.0))
        await asyncio.sleep(0)
        async with http.get(server.make_url("/health")) as resp:
            assert resp.status == 503 and (await resp.json())["status"] == "draining"
        async with http.post(server.make_url("/v1/messages"), json=MESSAGES) as resp:
            assert resp.status == 503 and resp.headers.get("Connection") == "close"
            body = await resp.json()
            assert body["type"] == "error" and "shutting down" in body["error"]["message"]
        assert not drained.done()
        rest = (await stream.read()).decode()
        assert rest.rstrip().endswith("data: [DONE]") and '"finish_reason":"length"' in rest.replace(" ", "")
        assert await asyncio.wait_for(drained, 5.0) == 0  # nothing was left in flight
    await server.close()


async def test_the_wait_ends_after_the_timeout_with_what_is_left():
    server, gateway = await _server(FakePool(tokens=range(1000, 1100), delay_s=0.2))
    async with ClientSession() as http:
        stream = await http.post(server.make_url("/v1/chat/completions"), json={**CHAT, "max_tokens": 100})
        await stream.content.readuntil(b"\n\n")
        t0 = time.monotonic()
        assert await gateway.drain(0.3) == 1
        assert 0.25 < time.monotonic() - t0 < 2.0
        stream.close()
    await server.close()


async def test_an_idle_gateway_drains_at_once():
    server, gateway = await _server(FakePool())
    t0 = time.monotonic()
    assert await gateway.drain(30.0) == 0
    assert time.monotonic() - t0 < 0.5
    await server.close()
