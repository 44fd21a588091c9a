"""Usage reports the prompt tokens the engine reused, not what the entrypoint's CHECK replica
predicted: real processes (controller, kvstore, prefill, decode, entrypoint), HTTP requests.

The replica of a kvstore that went away keeps answering from its last state, so it still
predicts a hit; the prefill's fetch fails, the engine computes the whole prompt, and usage says 0.
"""

from __future__ import annotations

import asyncio
import re

import aiohttp
import pytest

from tests.dsi.cli.procs import Procs
from tests.roles.cluster import Client, Cluster, cluster_config

pytestmark = [pytest.mark.slow, pytest.mark.concurrent]

ROLES = ("controller-0", "kvstore-0", "prefill-0", "decode-0", "entrypoint-0")
LONG = "the quick brown fox jumps over the lazy dog " * 60  # about 600 tokens: 4 full blocks
BODY = {
    "model": "dsi-tiny",
    "messages": [{"role": "user", "content": LONG}],
    "max_tokens": 2,
    "reasoning_effort": "none",
}


async def metric(http: aiohttp.ClientSession, base: str, name: str) -> float:
    async with http.get(f"{base}/metrics") as resp:
        text = await resp.text()
    found = re.search(rf"(?m)^{name} (\S+)$", text)
    return float(found.group(1)) if found else 0.0


async def cached_in_usage(http: aiohttp.ClientSession, base: str, stream: bool) -> int:
    body = {**BODY, "stream": True, "stream_options": {"include_usage": True}} if stream else BODY
    async with http.post(f"{base}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        if not stream:
            return (await resp.json())["usage"]["prompt_tokens_details"]["cached_tokens"]
        text = await resp.text()
    found = re.findall(r'"cached_tokens":(\d+)', text.replace(" ", ""))
    assert len(found) == 1, text  # the usage chunk
    return int(found[0])


async def until(check, timeout: float = 60.0) -> None:
    for _ in range(int(timeout / 0.2)):
        if await check():
            return
        await asyncio.sleep(0.2)
    raise AssertionError("condition not met in time")


async def test_usage_reports_the_engines_reuse_when_the_prediction_is_stale(tmp_path):
    config = cluster_config(tmp_path, keep=ROLES)
    base = "http://" + re.search(r'http = "([^"]+)"', config.read_text()).group(1)  # type: ignore[union-attr]
    with Procs(tmp_path) as procs:
        cluster = Cluster(config, procs)
        cluster.start()
        async with Client(cluster) as client, aiohttp.ClientSession() as http:

            async def serving() -> bool:
                async with http.get(f"{base}/health") as resp:
                    return resp.status == 200 and (await resp.json())["prefill_instances"] == 1

            await until(serving)
            assert await cached_in_usage(http, base, stream=False) == 0  # cold: nothing stored yet
            await until(
                lambda: _at_least(metric(http, base, "dsi_kv_replica_blocks"), 4)
            )  # the prompt's 4 pages

            # The store is there: the engine reuses the hit, and usage says how much.
            predicted = await metric(http, base, "dsi_prefix_hit_tokens_total")
            reused = await cached_in_usage(http, base, stream=False)
            engine = (await client.stats("prefill-0")).cached_tokens
            assert reused == engine > 0
            assert await metric(http, base, "dsi_prefix_hit_tokens_total") - predicted == 512

            # The store goes away: the replica still predicts the hit; the engine reuses nothing.
            cluster.kill("kvstore-0")
            for stream in (False, True):
                predicted = await metric(http, base, "dsi_prefix_hit_tokens_total")
                assert await cached_in_usage(http, base, stream=stream) == 0
                assert await metric(http, base, "dsi_prefix_hit_tokens_total") - predicted == 512
            assert (await client.stats("prefill-0")).cached_tokens == engine  # no more reuse
            assert await metric(http, base, "dsi_engine_cached_tokens_total") == engine


async def _at_least(value, n: float) -> bool:
    return await value >= n
