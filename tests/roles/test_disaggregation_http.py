"""64 concurrent streaming Chat Completions over HTTP through the disaggregated local cluster:
every SSE stream is the one the recipe produces from a single in-process engine's greedy ids."""

from __future__ import annotations

import asyncio
import json
import random
import re

import aiohttp
import pytest

from dsi.engine.params import EOS_ID
from dsi.model.config import get_config
from dsi.recipe import ModelVersion, Recipe
from dsi.recipe.emit_stream import OutputStream
from dsi.roles.entrypoint.prepare import Preparer
from tests.roles.cluster import Client, Cluster, cluster_config, reference_outputs

pytestmark = [pytest.mark.slow, pytest.mark.concurrent]

WORDS = (
    "alpha",
    "ledger",
    "quantum",
    "river",
    "garden",
    "compile",
    "orbit",
    "spice",
    "tensor",
    "harbor",
    "日本",
    "数据",
)


def bodies(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [
        {
            "model": "dsi-tiny",
            "stream": True,
            "temperature": 0,
            "max_tokens": 10,
            "thinking": {"type": "disabled"},  # thinking mode samples at temperature 1 whatever is asked
            "messages": [
                {"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 80)))}
            ],
        }
        for _ in range(n)
    ]


def deltas(sse: str) -> tuple[str, str, list[str]]:
    """The streamed content, reasoning and finish reasons (chunking, ids and times left out)."""
    content, reasoning, finish = [], [], []
    for line in sse.splitlines():
        if line.startswith("data: {"):
            event = json.loads(line[6:])
            for choice in event.get("choices", []):
                delta = choice.get("delta", {})
                content.append(delta.get("content") or "")
                reasoning.append(delta.get("reasoning_content") or "")
                if choice.get("finish_reason"):
                    finish.append(choice["finish_reason"])
    return "".join(content), "".join(reasoning), finish


def expected_streams(requests: list[dict]) -> list[tuple[str, str, list[str]]]:
    preparer = Preparer(Recipe({"dsi-tiny": ModelVersion.V4}), get_config("tiny").max_context)
    prepared = [preparer("chat", json.dumps(body).encode(), "chatbot") for body in requests]
    outputs = reference_outputs([p.token_ids for p in prepared], max_tokens=10)
    streams = []
    for prep, ids in zip(prepared, outputs, strict=True):
        out = OutputStream(prep.options)
        pieces = out.feed(ids)
        pieces += out.finish("length" if len(ids) == 10 and ids[-1] != EOS_ID else "stop")
        streams.append(deltas("".join(pieces)))
    return streams


async def test_64_http_streams_match_one_engine(procs, tmp_path):
    config = cluster_config(
        tmp_path, keep=("controller-0", "entrypoint-0", "prefill-0", "prefill-1", "decode-0", "decode-1")
    )
    cluster = Cluster(config, procs)
    cluster.start()
    http = re.search(r'http = "([^"]+)"', config.read_text()).group(1)  # type: ignore[union-attr]
    requests = bodies(64, seed=11)
    expected = expected_streams(requests)
    async with Client(cluster) as client, aiohttp.ClientSession() as session:
        for _ in range(100):  # the gateway learns the instances by heartbeat
            async with session.get(f"http://{http}/health") as resp:
                health = await resp.json()
            if health["instances"] == 2 and health["prefill_instances"] == 2:
                break
            await asyncio.sleep(0.2)

        async def one(body: dict) -> str:
            async with session.post(f"http://{http}/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                return await resp.text()

        got = await asyncio.gather(*(one(body) for body in requests))
        handoffs = [(await client.stats(p)).handoffs for p in ("prefill-0", "prefill-1")]
    assert sum(bool(content) for content, _, _ in expected) > 48  # real text to compare
    assert [deltas(sse) for sse in got] == expected
    assert all(sse.rstrip().endswith("data: [DONE]") for sse in got)
    assert sum(handoffs) == 64  # the first token of each ended nothing: every one was handed off
