"""The gateway's HTTP layer over a fake engine pool: auth, limits, errors, fuzzing, disconnects."""

import asyncio
import json
import socket
import time

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsi.messages.handoff import HitUnavailable
from dsi.recipe import ModelVersion, Recipe
from dsi.roles.entrypoint.app import make_app
from dsi.roles.entrypoint.auth import ApiKeys
from dsi.roles.entrypoint.backends import NoInstance
from dsi.roles.entrypoint.gateway import Gateway
from dsi.roles.entrypoint.metrics import Metrics
from dsi.roles.entrypoint.prepare import Preparer
from dsi.roles.entrypoint.recovery import RecoveryDiverged
from tests.roles.entrypoint.fakes import FakePool

PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
GOOD = {
    "chat": {"model": "dsi-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
    "responses": {"model": "dsi-tiny", "input": "hi", "max_output_tokens": 3},
    "messages": {"model": "dsi-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
}


@pytest.fixture(scope="module")
def recipe():
    return Recipe({"dsi-tiny": ModelVersion.V4})


async def _server(recipe, pool=None, keys=None, max_body=1 << 20):
    gateway = Gateway(pool or FakePool(), keys or ApiKeys.load(None), Metrics(), Preparer(recipe, 16_384))
    server = TestServer(make_app(gateway, ["dsi-tiny"], max_body), host="127.0.0.1")
    await server.start_server()
    return server, gateway


def _assert_shape(protocol, status, body):
    if protocol == "messages":
        assert body["type"] == "error" and body["error"]["type"] and body["error"]["message"], body
    else:
        assert set(body["error"]) >= {"message", "type", "param", "code"} and body["error"]["message"], body


async def test_good_requests_in_each_protocol(recipe):
    server, _gateway = await _server(recipe)
    async with ClientSession() as http:
        for protocol, body in GOOD.items():
            async with http.post(server.make_url(PATHS[protocol]), json=body) as resp:
                assert resp.status == 200, await resp.text()
        async with http.get(server.make_url("/v1/models")) as resp:
            assert (await resp.json())["data"][0]["id"] == "dsi-tiny"
        async with http.get(server.make_url("/metrics")) as resp:
            text = await resp.text()
            assert (
                'dsi_requests_total{protocol="chat",status="200"} 1' in text
                and "dsi_ttft_seconds_count 3" in text
            )
            assert 'dsi_instance_transitions_total{role="decode",from="ready",to="serving"} 1' in text
        async with http.get(server.make_url("/openapi.json")) as resp:
            assert "/v1/messages" in (await resp.json())["paths"]
    await server.close()


BAD = [
    ("chat", b"{not json", 400),
    ("chat", b"\xff\xfe\x00garbage", 400),
    ("chat", b"[]", 400),
    ("chat", b'"a string"', 400),
    ("chat", {"messages": [{"role": "user", "content": "hi"}]}, 400),
    ("chat", {"model": "dsi-tiny"}, 400),
    ("chat", {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}, 404),
    ("chat", {"model": 7, "messages": [{"role": "user", "content": "hi"}]}, 400),
    ("chat", {"model": "dsi-tiny", "messages": "hi"}, 400),
    ("chat", {"model": "dsi-tiny", "messages": []}, 400),
    ("chat", {"model": "dsi-tiny", "messages": [{"role": "wizard", "content": "hi"}]}, 400),
    ("chat", {"model": "dsi-tiny", "messages": [{"content": "hi"}]}, 400),
    ("chat", {"model": "dsi-tiny", "messages": [{"role": "user", "content": 5}]}, 400),
    ("chat", {"model": "dsi-tiny", "messages": [{"role": "user", "content": "hi"}], "n": 2}, 400),
    ("chat", {"model": "dsi-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}, 400),
    ("chat", {"model": "dsi-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": "10"}, 400),
    (
        "chat",
        {"model": "dsi-tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"},
        400,
    ),
    ("chat", {"model": "dsi-tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": 9}, 400),
    ("chat", {"model": "dsi-tiny", "messages": [{"role": "user", "content": "hi"}], "top_p": 2}, 400),
    ("chat", {"model": "dsi-tiny", "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, 400),
    (
        "chat",
        {
            "model": "dsi-tiny",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function"}],
        },
        400,
    ),
    (
        "chat",
        {
            "model": "dsi-tiny",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": "not a schema"}}],
        },
        400,
    ),
    (
        "chat",
        {"model": "dsi-tiny", "messages": [{"role": "user", "content": "hi"}], "tool_choice": "sometimes"},
        400,
    ),
    (
        "chat",
        {
            "model": "dsi-tiny",
            "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "xml"},
        },
        400,
    ),
    (
        "chat",
        {"model": "dsi-tiny", "messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "huge"},
        400,
    ),
    ("responses", {"model": "dsi-tiny"}, 400),
    ("responses", {"model": "dsi-tiny", "input": 12}, 400),
    ("responses", {"model": "dsi-tiny", "input": [{"role": "alien", "content": "x"}]}, 400),
    ("responses", {"model": "dsi-tiny", "input": "hi", "max_output_tokens": 0}, 400),
    ("responses", {"model": "nope", "input": "hi"}, 404),
    ("responses", b"{", 400),
    (
        "messages",
        {"model": "dsi-tiny", "max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]},
        400,
    ),
    (
        "messages",
        {"model": "dsi-tiny", "max_tokens": 5, "messages": [{"role": "developer", "content": "x"}]},
        400,
    ),
    (
        "messages",
        {"model": "dsi-tiny", "max_tokens": -5, "messages": [{"role": "user", "content": "hi"}]},
        400,
    ),
    (
        "messages",
        {"model": "dsi-tiny", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "?"}]}]},
        400,
    ),
    (
        "messages",
        {
            "model": "dsi-tiny",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "f"}],
        },
        400,
    ),
    ("messages", {"model": "nope", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}, 404),
    ("messages", b"\x00\x01", 400),
]


async def test_at_least_30_malformed_requests_get_4xx_in_the_protocol_shape(recipe):
    assert len(BAD) >= 30
    server, _ = await _server(recipe)
    async with ClientSession() as http:
        for protocol, body, status in BAD:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            async with http.post(
                server.make_url(PATHS[protocol]), data=data, headers={"Content-Type": "application/json"}
            ) as resp:
                payload = await resp.json()
                assert 400 <= resp.status < 500, (protocol, body, resp.status, payload)
                assert resp.status == status, (protocol, body, resp.status, payload)
                _assert_shape(protocol, resp.status, payload)
        async with http.post(server.make_url("/v1/nothing"), json={}) as resp:
            assert resp.status == 404
        async with http.get(server.make_url(PATHS["chat"])) as resp:
            assert resp.status == 405
    await server.close()


async def test_body_limit_auth_and_concurrency(recipe, tmp_path):
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text('[[keys]]\nkey = "sk-a"\nname = "a"\nmax_concurrency = 1\n')
    pool = FakePool(tokens=range(100, 140), delay_s=0.05)
    server, _ = await _server(recipe, pool, ApiKeys.load(keys_file), max_body=4096)
    async with ClientSession() as http:
        for protocol in PATHS:
            async with http.post(server.make_url(PATHS[protocol]), json=GOOD[protocol]) as resp:
                assert resp.status == 401
                _assert_shape(protocol, 401, await resp.json())
        async with http.post(
            server.make_url(PATHS["messages"]), json=GOOD["messages"], headers={"x-api-key": "sk-a"}
        ) as resp:
            assert resp.status == 200
        big = {**GOOD["chat"], "messages": [{"role": "user", "content": "x" * 10_000}]}
        async with http.post(
            server.make_url(PATHS["chat"]), json=big, headers={"Authorization": "Bearer sk-a"}
        ) as resp:
            assert resp.status == 413
            _assert_shape("chat", 413, await resp.json())
        slow = {**GOOD["chat"], "max_tokens": 30}
        first = asyncio.ensure_future(
            http.post(server.make_url(PATHS["chat"]), json=slow, headers={"Authorization": "Bearer sk-a"})
        )
        await asyncio.sleep(0.3)
        async with http.post(
            server.make_url(PATHS["chat"]), json=GOOD["chat"], headers={"Authorization": "Bearer sk-a"}
        ) as resp:
            assert resp.status == 429
            _assert_shape("chat", 429, await resp.json())
        (await first).release()
    await server.close()


async def test_no_instance_is_503(recipe):
    server, _ = await _server(recipe, FakePool(ready=False))
    async with ClientSession() as http:
        for protocol in PATHS:
            for stream in (False, True):
                async with http.post(
                    server.make_url(PATHS[protocol]), json={**GOOD[protocol], "stream": stream}
                ) as r:
                    assert r.status == 503
                    _assert_shape(protocol, 503, await r.json())
    await server.close()


V41_EFFORT = {
    "chat": {
        "model": "DeepSeek-V4.1-Flash",
        "messages": [{"role": "user", "content": "hi"}],
        "reasoning_effort": "max",
    },
    "responses": {"model": "DeepSeek-V4.1-Flash", "input": "hi", "reasoning": {"effort": "high"}},
    "messages": {
        "model": "DeepSeek-V4.1-Flash",
        "max_tokens": 64,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "hi"}],
        "output_config": {"effort": "max"},
    },
}


async def test_a_control_token_the_served_vocabulary_lacks_is_a_400_naming_it(recipe):
    """V4.1 with reasoning effort needs <｜System｜>, which the shipped V4 vocabulary lacks: the
    model could not see the effort, so serving refuses what ``dsi recipe render`` still renders."""
    server, _ = await _server(recipe)
    async with ClientSession() as http:
        for protocol, body in V41_EFFORT.items():
            async with http.post(server.make_url(PATHS[protocol]), json=body) as resp:
                payload = await resp.json()
                assert resp.status == 400, payload
                _assert_shape(protocol, 400, payload)
                assert "<｜System｜>" in payload["error"]["message"]
                if protocol != "messages":
                    assert payload["error"]["code"] == "unsupported_control_token"
    await server.close()


async def test_client_disconnect_closes_the_engine_stream(recipe):
    pool = FakePool(tokens=range(100, 400), delay_s=0.02)
    server, gateway = await _server(recipe, pool)
    async with ClientSession() as http:
        body = {**GOOD["chat"], "max_tokens": 300, "stream": True}
        resp = await http.post(server.make_url(PATHS["chat"]), json=body)
        await resp.content.readline()
        resp.close()  # the client goes away mid-stream
    for _ in range(100):
        if pool.cancelled == 1 and gateway.metrics.in_flight == 0:
            break
        await asyncio.sleep(0.05)
    assert pool.cancelled == 1 and gateway.metrics.in_flight == 0
    await server.close()


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
_FIELDS = {
    "model": st.sampled_from(["dsi-tiny", "DeepSeek-V4-Pro", "x"]) | _JSON,
    "messages": st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "assistant", "system", "tool", "developer", "bad"]) | _JSON},
            optional={"content": st.text(max_size=30) | _JSON, "tool_calls": _JSON, "tool_call_id": _JSON},
        ),
        max_size=3,
    )
    | _JSON,
    "input": st.text(max_size=30) | _JSON,
    "max_tokens": st.integers(-3, 3) | _JSON,
    "max_output_tokens": st.integers(-3, 3) | _JSON,
    "stream": st.booleans() | _JSON,
    "tools": _JSON,
    "tool_choice": _JSON,
    "temperature": _JSON,
    "top_p": _JSON,
    "stop": _JSON,
    "n": _JSON,
    "response_format": _JSON,
    "thinking": _JSON,
    "reasoning_effort": _JSON,
    "system": _JSON,
}
_BODIES = st.fixed_dictionaries({}, optional=_FIELDS) | _JSON | st.binary(max_size=40)


async def test_fuzz_2000_requests_no_5xx(recipe):
    server, _gateway = await _server(recipe)
    loop = asyncio.get_running_loop()
    sent = []
    async with ClientSession() as http:

        async def post(protocol, body):
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            async with http.post(
                server.make_url(PATHS[protocol]), data=data, headers={"Content-Type": "application/json"}
            ) as resp:
                await resp.read()
                return resp.status

        @settings(max_examples=700, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(body=_BODIES)
        def run(body):
            for protocol in PATHS:
                status = asyncio.run_coroutine_threadsafe(post(protocol, body), loop).result(30)
                sent.append(status)
                assert status < 500, (protocol, body, status)

        await loop.run_in_executor(None, run)
        for protocol, body in GOOD.items():  # still serving
            assert await post(protocol, body) == 200
    assert len(sent) >= 2000
    await server.close()


FAILURES = [
    RecoveryDiverged("the re-run produced token 7 at position 2 where the client already has 3000"),
    NoInstance("no serving decode instance to take the request over within 5s"),
    HitUnavailable("the re-run is pinned to a bounded-replay hit of 256 tokens"),
]


@pytest.mark.parametrize("error", FAILURES, ids=lambda e: e.code)
async def test_a_failed_recovery_mid_stream_ends_with_the_protocols_error_event(recipe, error):
    """Two tokens went out, then the request cannot go on: the stream ends with the protocol's
    error event (no more content, no normal finish), and a non-streamed request gets the error body."""
    server, gateway = await _server(
        recipe, FakePool(tokens=(1000, 2000, 3000, 4000), fail_after=2, error=error)
    )
    async with ClientSession() as http:
        for protocol in PATHS:
            body = {**GOOD[protocol], "max_tokens" if protocol != "responses" else "max_output_tokens": 4}
            async with http.post(server.make_url(PATHS[protocol]), json={**body, "stream": True}) as resp:
                assert resp.status == 200
                events = _sse(await resp.text())
            name, last = events[-1]
            if protocol == "chat":
                assert name is None and error.code in last["error"]["message"]
                assert all(
                    "choices" in e and not e["choices"][0].get("finish_reason") for _, e in events[:-1]
                )
            elif protocol == "responses":
                assert name == "response.failed" and error.code in last["response"]["error"]["message"]
                assert not any(n in ("response.completed", "response.incomplete") for n, _ in events)
            else:
                assert name == "error" and last["type"] == "error" and error.code in last["error"]["message"]
                assert not any(n == "message_stop" for n, _ in events)
            async with http.post(server.make_url(PATHS[protocol]), json=body) as resp:
                status = resp.status
                _assert_shape(protocol, status, await resp.json())
            assert status == (503 if isinstance(error, NoInstance) else 500)
    assert gateway.metrics.in_flight == 0
    await server.close()


def _sse(text: str) -> list[tuple[str | None, dict]]:
    """(event name or None, data) of every SSE event but ``[DONE]``."""
    events = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        if lines.get("data") != "[DONE]":
            events.append((lines.get("event"), json.loads(lines["data"])))
    return events


async def test_a_client_that_stops_reading_holds_a_bounded_buffer_and_is_cut_off(recipe):
    # A raw socket with a small receive window asks for a long stream and never reads: the
    # gateway's writes back up, the transport's buffer stays bounded, and after the stall
    # timeout the stream is aborted and the engine stream closed (CANCEL upstream).
    max_tokens = 300_000
    pool = FakePool(tokens=range(100, 100 + max_tokens))
    gateway = Gateway(
        pool, ApiKeys.load(None), Metrics(), Preparer(recipe, 1 << 20), slow_reader_timeout_s=0.5
    )
    server = TestServer(make_app(gateway, ["dsi-tiny"], 1 << 20), host="127.0.0.1")
    await server.start_server()
    body = json.dumps({**GOOD["chat"], "max_tokens": max_tokens, "stream": True}).encode()
    head = (
        f"POST {PATHS['chat']} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    loop = asyncio.get_running_loop()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await loop.sock_connect(sock, (server.host, server.port))
        await loop.sock_sendall(sock, head + body)
        t0 = time.monotonic()
        while (pool.cancelled == 0 or gateway.metrics.in_flight) and time.monotonic() - t0 < 20:
            await asyncio.sleep(0.05)
    assert pool.cancelled == 1 and gateway.metrics.in_flight == 0
    assert gateway.metrics.errors["slow_reader"] == 1
    assert 0 < gateway.metrics.sse_buffer_peak_bytes <= 256 * 1024, gateway.metrics.sse_buffer_peak_bytes
    assert gateway.metrics.generated_tokens < max_tokens // 4  # the engine stream stopped early
    await server.close()
