"""Image URLs at the gateway: a refused fetch is a 400 in the request's protocol, and with
fetching on the request is prepared off the event loop."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from dsi.model.vit import TINY_VISION
from dsi.recipe import ModelVersion, Recipe
from dsi.recipe.images import ImageLimits
from dsi.recipe.models import ModelTable, ServedModel
from dsi.recipe.vision_prompt import VisionSpec
from dsi.roles.entrypoint.app import make_app
from dsi.roles.entrypoint.auth import ApiKeys
from dsi.roles.entrypoint.gateway import Gateway
from dsi.roles.entrypoint.metrics import Metrics
from dsi.roles.entrypoint.prepare import Preparer
from tests.roles.entrypoint.fakes import FakePool

FETCHING = VisionSpec(TINY_VISION, ImageLimits(allow_fetch=True, fetch_timeout_s=5.0))


class _Counting(BaseHTTPRequestHandler):
    hits = 0

    def do_GET(self) -> None:
        type(self).hits += 1
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def local_image_url():
    """An http URL on 127.0.0.1 and the number of requests it got (read after the test)."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    _Counting.hits = 0
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/cat.png"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


class _ThreadOf:
    """A preparer that records the thread each call runs in."""

    def __init__(self, preparer: Preparer) -> None:
        self.preparer = preparer
        self.threads: list[int] = []

    def __call__(self, *args):
        self.threads.append(threading.get_ident())
        return self.preparer(*args)


async def _serve(preparer, prepare_in_thread: bool) -> TestServer:
    gateway = Gateway(
        FakePool(), ApiKeys.load(None), Metrics(), preparer, prepare_in_thread=prepare_in_thread
    )
    server = TestServer(make_app(gateway, ["m"], 1 << 20), host="127.0.0.1")
    await server.start_server()
    return server


async def test_an_internal_image_url_is_a_400_in_each_protocol(local_image_url):
    recipe = Recipe(models=ModelTable({"m": ServedModel("m", ModelVersion.V4, vision=FETCHING)}))
    server = await _serve(Preparer(recipe, 16_384), prepare_in_thread=True)
    chat = {
        "model": "m",
        "max_tokens": 3,
        "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": local_image_url}}]}
        ],
    }
    responses = {
        "model": "m",
        "input": [{"role": "user", "content": [{"type": "input_image", "image_url": local_image_url}]}],
    }
    try:
        async with ClientSession() as http:
            async with http.post(server.make_url("/v1/chat/completions"), json=chat) as resp:
                body = await resp.json()
                assert resp.status == 400, body
                assert body["error"]["code"] == "invalid_image" and body["error"]["param"] == "image[0]"
                assert "127.0.0.1, a loopback address" in body["error"]["message"]
            async with http.post(server.make_url("/v1/responses"), json=responses) as resp:
                body = await resp.json()
                assert resp.status == 400 and body["error"]["code"] == "invalid_image", body
    finally:
        await server.close()
    assert _Counting.hits == 0


@pytest.mark.parametrize("in_thread", [True, False])
async def test_with_fetching_on_requests_are_prepared_off_the_event_loop(in_thread):
    preparer = _ThreadOf(Preparer(Recipe({"m": ModelVersion.V4}), 16_384))
    server = await _serve(preparer, prepare_in_thread=in_thread)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    try:
        async with (
            ClientSession() as http,
            http.post(server.make_url("/v1/chat/completions"), json=body) as resp,
        ):
            assert resp.status == 200, await resp.text()
    finally:
        await server.close()
    assert len(preparer.threads) == 1
    assert (preparer.threads[0] != threading.get_ident()) is in_thread
