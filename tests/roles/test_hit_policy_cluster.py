"""hit_policy = "exact" through the disaggregated cluster (the `dsi serve` layout): 16 greedy prompts
of 100-1,000 tokens, each sent twice on a cold store, answer the same both times; the same
prompts under "bounded" take replay hits that change answers (so the exact case is not vacuous)."""

from __future__ import annotations

import asyncio
import random

import pytest

from tests.roles.cluster import Client, Cluster, cluster_config
from tests.roles.test_prefix_cache_cluster import wait_blocks

pytestmark = [pytest.mark.slow, pytest.mark.concurrent]
ROLES = ("controller-0", "kvstore-0", "prefill-0", "prefill-1", "decode-0", "decode-1")
TOKENS = 12


async def _all(
    client: Client, tag: str, prompts: list[list[int]], policy: str | None = None
) -> list[list[int]]:
    return list(
        await asyncio.gather(
            *(client.generate(f"{tag}{i}", p, TOKENS, hit_policy=policy) for i, p in enumerate(prompts))
        )
    )


async def test_exact_answers_a_repeated_prompt_identically_bounded_may_not(procs, tmp_path):
    rng = random.Random(7)
    prompts = [[rng.randrange(100, 120_000) for _ in range(rng.randint(100, 1000))] for _ in range(16)]
    pages = sum((len(p) + TOKENS - 1) // 128 for p in prompts)  # full pages of prompt + output
    cluster = Cluster(cluster_config(tmp_path, keep=ROLES, hit_policy="exact"), procs)
    cluster.start()
    async with Client(cluster) as client:
        first = await _all(client, "a", prompts)
        await wait_blocks(cluster, pages)
        second = await _all(client, "b", prompts)  # the cluster's policy: exact
        bounded = await _all(client, "c", prompts, "bounded")  # the same store, replay hits allowed
        stats = [await client.stats(p) for p in ("prefill-0", "prefill-1")]
    assert second == first
    assert sum(s.cached_tokens for s in stats) > 0  # the bounded pass did hit the store
    assert bounded != first  # bounded replay changes some greedy answers on these weights
