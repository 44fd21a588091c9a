"""A decode killed mid-stream, seen by an HTTP client of the gateway (real processes).

- The re-run diverges: the decode left computes with other weights (as a faulty device would), so
  its tokens differ from those already sent. The Chat Completions stream ends with the error event
  after a prefix of the undisturbed text: never a splice of two continuations.
- No decode is left: the Anthropic Messages stream ends with ``event: error`` within the
  entrypoint's ``reroute_wait_s``, not a hang.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import time
from pathlib import Path

import aiohttp
import pytest

from dsi.model.config import get_config
from dsi.model.prepare import ensure_model
from dsi.model.weights import init_weights, load_model, save_model
from dsi.recipe import ModelVersion, Recipe
from dsi.recipe.emit_stream import OutputStream
from dsi.roles.entrypoint.prepare import Preparer
from tests.dsi.cli.procs import SHARED_MODEL_DIR, Procs, python_module
from tests.roles.cluster import Client, Cluster, cluster_config, reference_outputs
from tests.roles.test_disaggregation_http import deltas

pytestmark = pytest.mark.slow

REROUTE_WAIT_S = 2.0
MAX_TOKENS = 64  # room to kill a stream after its 3rd delta; the reference decodes them all
TEXT = "the harbor ledger keeps a quantum river of spice and tensor gardens " * 12


def other_weights(directory: Path) -> Path:
    """The tiny model's shape and config.json with other weights (another init seed)."""
    cfg, _ = load_model(ensure_model(SHARED_MODEL_DIR, "tiny"))
    save_model(directory, cfg, init_weights(dataclasses.replace(cfg, seed=cfg.seed + 1)))
    return directory


def start_with_other_weights(cluster: Cluster, procs: Procs, role_id: str, tmp_path: Path) -> None:
    """Start one role of the cluster's config, reading its weights from another directory."""
    config = tmp_path / "other-weights.toml"
    config.write_text(
        cluster.config.read_text().replace(str(SHARED_MODEL_DIR), str(other_weights(tmp_path / "w2")))
    )
    proc = procs.start(role_id, python_module("dsi.cli.role", "--config", str(config), "--role", role_id))
    assert proc.wait_ready() == f"READY {role_id}"
    cluster.running[role_id] = proc


async def until_decodes(http: aiohttp.ClientSession, base: str, n: int) -> None:
    for _ in range(150):  # the gateway learns the instances by heartbeat
        async with http.get(f"{base}/health") as resp:
            health = await resp.json()
        if health.get("instances") == n and health.get("prefill_instances") == 1:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"the gateway sees {health}")


async def stream_and_kill(
    http: aiohttp.ClientSession, url: str, body: dict, kill, after: int = 3
) -> tuple[str, float]:
    """The whole SSE text of one request; ``kill()`` runs once ``after`` deltas arrived. Also the
    seconds from the kill to the end of the stream."""
    lines, deltas_seen, killed_at = [], 0, None
    async with http.post(url, json=body) as resp:
        assert resp.status == 200
        async for raw in resp.content:
            lines.append(raw.decode())
            deltas_seen += lines[-1].startswith("data: ") and '"delta"' in lines[-1]
            if killed_at is None and deltas_seen >= after:
                await kill()
                killed_at = time.monotonic()
    assert killed_at is not None, "".join(lines)
    return "".join(lines), time.monotonic() - killed_at


def expected_content(body: dict) -> str:
    """The undisturbed stream's text: the recipe over one in-process engine's greedy ids."""
    prep = Preparer(Recipe({"dsi-tiny": ModelVersion.V4}), get_config("tiny").max_context)(
        "chat", json.dumps(body).encode(), "chatbot"
    )
    out = OutputStream(prep.options)
    return deltas("".join(out.feed(reference_outputs([prep.token_ids], MAX_TOKENS)[0])))[0]


async def test_a_diverging_rerun_ends_the_stream_with_an_error_and_no_decode_left_ends_it_in_time(
    procs, tmp_path
):
    config = cluster_config(
        tmp_path, keep=("controller-0", "entrypoint-0", "prefill-0", "decode-0", "decode-1")
    )
    text = re.sub(r'(?m)^(http = "[^"]+")$', rf"\1\nreroute_wait_s = {REROUTE_WAIT_S}", config.read_text())
    config.write_text(text)
    base = "http://" + re.search(r'http = "([^"]+)"', text).group(1)  # type: ignore[union-attr]
    cluster = Cluster(config, procs)
    cluster.start("controller-0", "entrypoint-0", "prefill-0", "decode-0")
    start_with_other_weights(cluster, procs, "decode-1", tmp_path)
    chat = {
        "model": "dsi-tiny",
        "stream": True,
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
        "thinking": {"type": "disabled"},
        "messages": [{"role": "user", "content": TEXT}],
    }
    expected = expected_content(chat)
    async with Client(cluster) as client, aiohttp.ClientSession() as http:
        await until_decodes(http, base, 2)

        async def kill_decode_0() -> None:
            assert [d for d in ("decode-0", "decode-1") if (await client.stats(d)).running] == ["decode-0"]
            cluster.kill("decode-0")  # the re-run goes to decode-1, whose weights differ

        sse, _ = await stream_and_kill(http, f"{base}/v1/chat/completions", chat, kill_decode_0)
        content, _, finish = deltas(sse)
        last = json.loads(sse.strip().splitlines()[-1].removeprefix("data: "))
        assert "recovery_diverged" in last["error"]["message"], sse[-2000:]
        assert (
            content and expected.startswith(content) and len(content) < len(expected)
        )  # a prefix, no splice
        assert finish == [] and "[DONE]" not in sse

        messages = {
            "model": "dsi-tiny",
            "stream": True,
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "messages": [{"role": "user", "content": TEXT}],
        }

        async def kill_decode_1() -> None:
            cluster.kill("decode-1")  # no decode is left

        sse, waited = await stream_and_kill(http, f"{base}/v1/messages", messages, kill_decode_1)
        name, data = sse.strip().split("\n\n")[-1].splitlines()
        assert (
            name == "event: error"
            and "no_instance" in json.loads(data.removeprefix("data: "))["error"]["message"]
        )
        assert "message_stop" not in sse
        assert REROUTE_WAIT_S - 0.1 <= waited < REROUTE_WAIT_S + 3.0
