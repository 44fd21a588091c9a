"""Prefill/decode disaggregation with real processes: identical outputs, failures, no leaks."""

from __future__ import annotations

import asyncio
import random
import signal

import pytest

from dsi.engine.params import SamplingParams
from dsi.messages.gateway import Generate
from tests.roles.cluster import Client, Cluster, cluster_config, reference_outputs

pytestmark = pytest.mark.slow

ENGINES = ("prefill-0", "prefill-1", "decode-0", "decode-1")


def prompts(n: int, seed: int, lo: int = 1, hi: int = 700) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 20_000) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


async def assert_no_leaks(client: Client, roles: tuple[str, ...]) -> None:
    """Every engine's pages, slots, leases and receive regions are back to baseline."""
    for _ in range(100):
        stats = {r: await client.stats(r) for r in roles}
        if all(
            s.free_blocks == s.total_blocks
            and s.free_slots == s.total_slots
            and s.leases == 0
            and s.regions == 0
            for s in stats.values()
        ):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"memory not returned: {stats}")


async def until_running(client: Client, role: str) -> None:
    for _ in range(500):
        if (await client.stats(role)).running:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{role} never had a request")


@pytest.mark.parametrize("backend", ["tcp", "shm"])
async def test_64_concurrent_streams_match_one_engine(procs, tmp_path, backend):
    cluster = Cluster(cluster_config(tmp_path, backend=backend, keep=("controller-0", *ENGINES)), procs)
    cluster.start()
    batch = prompts(64, seed=1)
    expected = reference_outputs(batch, max_tokens=12)
    async with Client(cluster) as client:
        got = await asyncio.gather(*(client.generate(f"r{i}", p, 12) for i, p in enumerate(batch)))
        assert got == expected
        stats = {r: await client.stats(r) for r in ENGINES}
        assert sum(stats[p].handoffs for p in ("prefill-0", "prefill-1")) == 64
        assert all(stats[p].prefills > 0 for p in ("prefill-0", "prefill-1"))  # least loaded spreads
        assert client.pool.retries == 0
        await assert_no_leaks(client, ENGINES)


async def test_killed_prefill_is_retried_elsewhere(procs, tmp_path):
    cluster = Cluster(cluster_config(tmp_path, keep=("controller-0", *ENGINES)), procs)
    cluster.start()
    batch = prompts(6, seed=2, lo=1500, hi=1900)  # long prompts: the prefill is busy a while
    expected = reference_outputs(batch, max_tokens=8)
    async with Client(cluster) as client:
        tasks = [asyncio.create_task(client.generate(f"k{i}", p, 8)) for i, p in enumerate(batch)]
        await until_running(client, "prefill-0")  # kill it while it holds work
        cluster.kill("prefill-0")
        got = await asyncio.wait_for(asyncio.gather(*tasks), 120)
        assert got == expected
        assert client.pool.retries >= 1
        await assert_no_leaks(client, ("prefill-1", "decode-0", "decode-1"))


async def test_stalled_prefill_lease_expires_and_the_request_moves_on(procs, tmp_path):
    config = cluster_config(
        tmp_path, lease_timeout_s=3.0, keep=("controller-0", "prefill-0", "prefill-1", "decode-0")
    )
    cluster = Cluster(config, procs)
    cluster.start()
    batch = prompts(4, seed=4, lo=100, hi=400)
    expected = reference_outputs(batch, max_tokens=6)
    async with Client(cluster) as client:
        cluster.kill("prefill-0", signal.SIGSTOP)  # alive for the controller for a while, but silent
        try:
            got = await asyncio.wait_for(
                asyncio.gather(*(client.generate(f"s{i}", p, 6) for i, p in enumerate(batch))), 60
            )
        finally:
            cluster.kill("prefill-0", signal.SIGCONT)
        assert got == expected
        stats = await client.stats("decode-0")
        assert stats.failed_handoffs >= 1
        await assert_no_leaks(client, ("prefill-1", "decode-0"))


async def test_a_client_that_goes_away_cancels_prefill_and_decode(procs, tmp_path):
    cluster = Cluster(cluster_config(tmp_path, keep=("controller-0", "prefill-0", "decode-0")), procs)
    cluster.start()
    long_prompt = prompts(1, seed=6, lo=1900, hi=1900)[0]
    async with Client(cluster) as client:
        # Gone while the prompt is being prefilled: the decode's PrefillTo is cancelled too.
        task = asyncio.create_task(client.generate("gone-early", long_prompt, 400))
        await until_running(client, "prefill-0")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await assert_no_leaks(client, ("prefill-0", "decode-0"))
        # Gone while decoding.
        stream = client.pool.generate(
            Generate("gone-late", long_prompt, SamplingParams(max_tokens=400, temperature=0))
        )
        await stream.__anext__()
        await stream.aclose()
        await assert_no_leaks(client, ("prefill-0", "decode-0"))
        assert (await client.stats("decode-0")).running == 0
