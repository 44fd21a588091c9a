"""The gateway's access log over a fake engine pool: one record per request with what it did,
refused requests included, never the API key itself; its text and JSON lines."""

import io
import json
import logging

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from dsi.logs import setup_logging
from dsi.recipe import ModelVersion, Recipe
from dsi.roles.entrypoint.access_log import ACCESS_LOGGER, AccessRecord, log_access
from dsi.roles.entrypoint.app import make_app
from dsi.roles.entrypoint.auth import ApiKeys
from dsi.roles.entrypoint.gateway import Gateway
from dsi.roles.entrypoint.metrics import Metrics
from dsi.roles.entrypoint.prepare import Preparer
from tests.roles.entrypoint.fakes import FakePool

CHAT = {"model": "dsi-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
FIELDS = {
    "request_id", "route", "protocol", "worker", "key_name", "prefill", "decode", "prompt_tokens",
    "cached_tokens", "output_tokens", "ttft_ms", "total_ms", "status", "finish_reason",
}  # fmt: skip


@pytest.fixture
def keys_file(tmp_path):
    path = tmp_path / "keys.toml"
    path.write_text('[[keys]]\nkey = "sk-secret-a"\nname = "team-a"\nmax_concurrency = 1\n')
    return path


async def test_one_record_per_request_with_what_it_did(keys_file, caplog):
    recipe = Recipe({"dsi-tiny": ModelVersion.V4})
    gateway = Gateway(
        FakePool(engine_cached=2), ApiKeys.load(keys_file), Metrics(), Preparer(recipe, 16_384), worker="e.w1"
    )
    server = TestServer(make_app(gateway, ["dsi-tiny"], 1 << 20), host="127.0.0.1")
    await server.start_server()
    auth = {"Authorization": "Bearer sk-secret-a"}
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    async with ClientSession() as http:
        async with http.post(server.make_url("/v1/chat/completions"), json=CHAT, headers=auth) as resp:
            done = await resp.json()
        async with http.post(
            server.make_url("/v1/messages"), json={**CHAT, "stream": True}, headers=auth
        ) as resp:
            assert resp.status == 200
            await resp.read()
        async with http.post(server.make_url("/v1/chat/completions"), json=CHAT) as resp:
            assert resp.status == 401
    await server.close()
    records = [r for r in caplog.records if r.name == ACCESS_LOGGER]
    assert len(records) == 3
    full, streamed, refused = (r.fields for r in records)  # type: ignore[attr-defined]
    assert set(full) == FIELDS
    assert full["request_id"] == done["id"] and full["route"] == "/v1/chat/completions"
    assert (full["protocol"], full["worker"], full["key_name"]) == ("chat", "e.w1", "team-a")
    assert (full["decode"], full["prefill"]) == ("fake-0", "-")
    assert full["prompt_tokens"] == done["usage"]["prompt_tokens"]
    assert full["output_tokens"] == done["usage"]["completion_tokens"] == 3
    assert full["cached_tokens"] == 2 and full["status"] == 200 and full["finish_reason"] == "length"
    assert 0 <= full["ttft_ms"] <= full["total_ms"]
    assert streamed["protocol"] == "messages" and streamed["status"] == 200
    assert streamed["finish_reason"] == "length" and streamed["output_tokens"] == 3
    assert refused["status"] == 401 and refused["key_name"] == "-" and refused["request_id"] == "-"
    assert refused["ttft_ms"] is None and refused["finish_reason"] == "-"
    assert not any("sk-secret-a" in r.getMessage() or "sk-secret-a" in str(r.fields) for r in records)  # type: ignore[attr-defined]


def _line(fmt: str) -> str:
    """The access line of one record, logged as a role process logs in ``fmt``."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    out = io.StringIO()
    setup_logging(fmt, "info", role="entrypoint-0", stream=out)  # type: ignore[arg-type]
    try:
        record = AccessRecord("/v1/responses", "responses", "entrypoint-0", start=1.0, request_id="resp-1")
        record.placement.decode, record.placement.prefill = "decode-1", "prefill-0"
        record.prompt_tokens, record.output_tokens, record.first_token = 12, 4, 1.5
        record.status, record.finish_reason = 200, "stop"
        log_access(record)
    finally:
        root.handlers[:] = handlers  # pytest's own, as they were
        root.setLevel(level)
    return out.getvalue()


def test_a_text_line_is_key_value_pairs_after_the_usual_prefix():
    line = _line("text")
    assert (
        " INFO [entrypoint-0] dsi.access: request_id=resp-1 route=/v1/responses protocol=responses " in line
    )
    assert (
        "prefill=prefill-0 decode=decode-1 prompt_tokens=12 cached_tokens=0 output_tokens=4 ttft_ms=500.0"
        in line
    )
    assert line.rstrip().endswith("status=200 finish_reason=stop")


def test_a_json_line_carries_the_fields_as_keys():
    line = json.loads(_line("json"))
    assert line["logger"] == "dsi.access" and line["role"] == "entrypoint-0" and line["level"] == "info"
    assert line["request_id"] == "resp-1" and line["ttft_ms"] == 500.0 and line["status"] == 200
    assert line["decode"] == "decode-1" and line["key_name"] == "-" and line["total_ms"] > 0
    assert line["msg"].startswith("request_id=resp-1 ")
