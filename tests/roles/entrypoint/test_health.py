"""/health says whether the cluster can serve a request, with real role processes: 503 with the
reason while no decode instance is ready (a prefill alone cannot serve), 200 once one registers."""

import json
import re
import time
import urllib.error
import urllib.request

import pytest

from dsi.roles.entrypoint.app import health_status
from tests.dsi.cli.procs import Procs
from tests.roles.cluster import Cluster, cluster_config

ROLES = ("controller-0", "entrypoint-0", "prefill-0", "decode-0")


def get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def wait_health(url: str, check, timeout: float = 60.0) -> tuple[int, dict]:
    """The first (status, body) of ``url`` that passes ``check``; fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        got = get(url)
        if check(*got) or time.monotonic() > deadline:
            assert check(*got), got
            return got
        time.sleep(0.2)


def test_health_status_rule():
    assert health_status(1, 0) == (200, {"status": "ok", "instances": 1, "prefill_instances": 0})
    status, body = health_status(0, 2)
    assert status == 503 and body["status"] == "unavailable" and "decode" in body["reason"]
    assert "2 prefill" in body["reason"]
    assert health_status(0, 0)[0] == 503


@pytest.mark.slow
@pytest.mark.concurrent
def test_health_is_503_until_a_decode_instance_registers(tmp_path):
    config = cluster_config(tmp_path, keep=ROLES)
    http = re.search(r'http = "([^"]+)"', config.read_text()).group(1)  # type: ignore[union-attr]
    base = f"http://{http}"
    with Procs(tmp_path) as procs:
        cluster = Cluster(config, procs)
        cluster.start("controller-0", "entrypoint-0", "prefill-0")
        status, body = wait_health(f"{base}/health", lambda status, _: status == 503)
        assert body["status"] == "unavailable" and body["instances"] == 0
        assert "no serving decode instance" in body["reason"]
        # the prefill registers too: still no way to serve a request
        status, body = wait_health(f"{base}/health", lambda _, b: b["prefill_instances"] == 1)
        assert status == 503 and body["status"] == "unavailable" and "1 prefill serving" in body["reason"]
        chat = {"model": "dsi-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        status, answer = post(f"{base}/v1/chat/completions", chat)
        assert status == 503 and "decode" in answer["error"]["message"]
        cluster.start("decode-0")
        _, body = wait_health(f"{base}/health", lambda status, _: status == 200)
        assert body == {"status": "ok", "instances": 1, "prefill_instances": 1, "worker": "entrypoint-0"}
        status, answer = post(f"{base}/v1/chat/completions", chat)
        assert status == 200 and answer["usage"]["completion_tokens"] == 2
        cluster.kill("decode-0")  # its heartbeats stop: the controller drops it, /health follows
        _, body = wait_health(f"{base}/health", lambda status, _: status == 503)
        assert body["instances"] == 0 and body["prefill_instances"] == 1
