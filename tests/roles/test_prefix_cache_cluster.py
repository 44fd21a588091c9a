"""The cluster KV cache end to end: decode persists, prefill hits (after restarts), corruption, the
hit policy."""

from __future__ import annotations

import asyncio
import functools
import random
from pathlib import Path

import pytest
import torch

from dsi.engine import CachedPrefix
from dsi.engine.engine import Engine, EngineConfig
from dsi.engine.params import SamplingParams
from dsi.messages.kvstore import GetStats, StoreStats
from dsi.model.prepare import ensure_model
from dsi.model.weights import load_model
from dsi.transport.client import Peer
from tests.dsi.cli.procs import SHARED_MODEL_DIR
from tests.roles.cluster import Client, Cluster, cluster_config, reference_outputs

pytestmark = pytest.mark.slow

ROLES = ("controller-0", "kvstore-0", "prefill-0", "decode-0")
BS = 128


def in_process(
    first: list[int], first_max: int, second: list[int], second_max: int, hit: int
) -> tuple[list[int], list[int]]:
    """One engine runs ``first`` cold and keeps its full pages; a second engine runs ``second``
    with the first ``hit`` tokens loaded from those pages (the engine's hit semantics). Greedy
    and deterministic: computed once per test process for the same arguments."""
    out_a, out_b = _in_process(tuple(first), first_max, tuple(second), second_max, hit)
    return list(out_a), list(out_b)


@functools.cache
def _in_process(
    first: tuple[int, ...], first_max: int, second: tuple[int, ...], second_max: int, hit: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    cfg, w = load_model(ensure_model(SHARED_MODEL_DIR, "tiny"))
    engine = Engine(cfg, w, EngineConfig(async_scheduling=False, collect_full_pages=True))
    engine.add_request("a", list(first), SamplingParams(max_tokens=first_max, temperature=0.0))
    out_a = next(o for o in engine.run_until_done() if o.finished).output
    pages = sorted(engine.take_full_pages(), key=lambda p: p.index)
    engine.close()
    cold = Engine(cfg, w, EngineConfig(async_scheduling=False))
    cached = CachedPrefix(hit, torch.stack([p.data for p in pages[: hit // BS]]))
    cold.add_request("b", list(second), SamplingParams(max_tokens=second_max, temperature=0.0), cached=cached)
    out_b = next(o for o in cold.run_until_done() if o.finished).output
    cold.close()
    return tuple(out_a), tuple(out_b)


async def store_stats(cluster: Cluster) -> StoreStats:
    import zmq.asyncio

    from dsi.messages import ALL

    ctx = zmq.asyncio.Context()
    peer = Peer(cluster.addresses["kvstore-0"], ctx, types=ALL, timeout=10)
    try:
        await peer.connect()
        return await peer.ask(GetStats())
    finally:
        await peer.close()
        ctx.destroy(linger=0)


async def wait_blocks(cluster: Cluster, n: int) -> StoreStats:
    for _ in range(200):
        stats = await store_stats(cluster)
        if stats.blocks >= n:
            return stats
        await asyncio.sleep(0.1)
    raise AssertionError(f"the kvstore holds {stats.blocks} blocks, expected {n}")


async def wait_states(cluster: Cluster, n: int) -> None:
    for _ in range(200):
        if (await store_stats(cluster)).states >= n:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the kvstore knows {(await store_stats(cluster)).states} SWA states, expected {n}")


def conversation(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 20_000) for _ in range(600)]


async def test_hits_survive_restarts_and_compute_only_the_uncached_tokens(procs, tmp_path):
    cluster = Cluster(cluster_config(tmp_path, keep=ROLES), procs)
    cluster.start()
    first = conversation(7)
    async with Client(cluster) as client:
        out_a = await client.generate("a", first, 100)  # 700 tokens: 5 full pages, prompt and generated
    await wait_blocks(cluster, 5)
    for role in ("kvstore-0", "prefill-0", "decode-0"):
        cluster.kill(role)
    cluster.start("kvstore-0", "prefill-0", "decode-0")
    second = first + out_a[:100] + [11, 12, 13] * 17  # shares 700 tokens: 5 full pages
    expect_a, expect_b = in_process(first, 100, second, 20, hit=5 * BS)
    assert out_a == expect_a
    async with Client(cluster) as client:
        await client.wait_instances()
        out_b = await client.generate("b", second, 20)
        stats = await client.stats("prefill-0")
    assert out_b == expect_b
    replay_from = min(5 * BS - BS, len(second) - 140)  # the window rebuilt for the SWA rings
    assert stats.cached_tokens == 5 * BS
    assert stats.replay_tokens == 5 * BS - replay_from
    assert stats.computed_prompt_tokens == len(second) - replay_from
    await asyncio.sleep(1.0)  # a replayed request's own pages never reach the store
    assert (await store_stats(cluster)).blocks == 5


async def test_a_corrupted_block_is_a_miss_and_the_request_still_succeeds(procs, tmp_path):
    cluster = Cluster(cluster_config(tmp_path, keep=ROLES), procs)
    cluster.start()
    first = conversation(8)
    async with Client(cluster) as client:
        await client.generate("a", first, 48)  # 647 tokens, 646 computed: 5 full pages
    await wait_blocks(cluster, 5)
    cluster.kill("kvstore-0")
    segments = sorted(Path(tmp_path, "run", "kvstore").rglob("seg-*.kv"))
    assert segments, list(Path(tmp_path, "run").rglob("*"))
    data = bytearray(segments[0].read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    segments[0].write_bytes(bytes(data))
    cluster.start("kvstore-0")
    second = first[:600] + [5] * 100
    async with Client(cluster) as client:
        await client.wait_instances()
        for attempt in range(40):  # the prefill's client answers misses at once until it has reconnected
            before = (await client.stats("prefill-0")).cached_tokens
            tokens = await client.generate(f"b{attempt}", second, 8)
            cached = (await client.stats("prefill-0")).cached_tokens - before
            if (await store_stats(cluster)).corrupt:
                break
            await asyncio.sleep(0.25)
    assert len(tokens) == 8
    assert cached < 5 * BS  # the run of hits stops at the corrupted block
    stats = await store_stats(cluster)
    assert stats.corrupt >= 1


async def test_a_hit_with_the_swa_state_pulled_from_the_decode_is_exact(procs, tmp_path):
    cluster = Cluster(cluster_config(tmp_path, keep=ROLES), procs)
    cluster.start()
    first = conversation(9)
    async with Client(cluster) as client:
        out_a = await client.generate("a", first, 100)  # the decode reaches boundary 640 and keeps its state
        await wait_blocks(cluster, 5)
        await wait_states(cluster, 1)  # kept when "a" finished, announced soon after
        second = first + out_a[:100] + [21, 22, 23, 24] * 50  # 900 tokens: an exact hit can end at 640
        expected = reference_outputs([second], max_tokens=20)[0]  # the hit-free output
        out_b = await client.generate("b", second, 20)
        prefill = await client.stats("prefill-0")
        decode = await client.stats("decode-0")
    # the hit first: an output that differs after a bounded replay (no state found) is not a defect
    # of the exact path, and these say which of the two happened
    if not (prefill.states_pulled == 1 and decode.states_served == 1):
        logs = "\n".join(f"--- {r}:\n{cluster.running[r].log()}" for r in ("prefill-0", "decode-0"))
        raise AssertionError(f"no state pulled\n{prefill}\n{decode}\n{await store_stats(cluster)}\n{logs}")
    assert prefill.cached_tokens == 5 * BS and prefill.replay_tokens == 0
    assert prefill.computed_prompt_tokens == len(first) + len(second) - 5 * BS
    assert out_b == expected
    await wait_blocks(cluster, 7)  # an exact hit's new pages are persisted (two more full pages)


async def test_the_exact_policy_takes_no_bounded_replay_hit_and_answers_the_hit_free_output(procs, tmp_path):
    cluster = Cluster(cluster_config(tmp_path, keep=ROLES, hit_policy="exact"), procs)
    cluster.start()
    prompt = conversation(10)[:300]  # an exact hit could end at 128 at most (consumer_start 160)
    async with Client(cluster) as client:
        first = await client.generate("a", prompt, 8)  # the store gets 2 pages; SWA states kept at 256
        await wait_blocks(cluster, 2)
        second = await client.generate("b", prompt, 8)  # the cluster's policy: exact
        after_exact = await client.stats("prefill-0")
        await client.generate("c", prompt, 8, hit_policy="bounded")  # per request: the bounded replay
        after_bounded = await client.stats("prefill-0")
    assert second == first  # the hit-free greedy answer
    assert after_exact.states_pulled == 0  # no SWA state at boundary 128 exists
    assert (after_exact.cached_tokens, after_exact.replay_tokens) == (0, 0)
    assert after_exact.computed_prompt_tokens == 2 * len(prompt)
    # the same prompt under "bounded": the whole stored run, the window before it replayed
    assert after_bounded.cached_tokens == 2 * BS
    assert after_bounded.replay_tokens == 2 * BS - min(2 * BS - BS, len(prompt) - 140)
