"""A decode killed (SIGKILL) while it streams: the request is re-run elsewhere, pinned to the
prefix hit its first run took, and the caller's stream is the undisturbed one, token for token.

Real processes (controller, kvstore, prefill, decodes); the router is the gateway's own
``DecodePool`` in the test process. The hit-path cases are engineered so that, without the pin,
the re-run would take another hit than the first run and answer differently. Greedy and seeded
streams across a killed decode under ``dsi serve`` are tests/dsi/cli/test_serve_failover.py's."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from dsi.engine.hit_policy import HitPolicy
from dsi.engine.params import SamplingParams
from dsi.messages.gateway import Generate
from dsi.messages.handoff import HitUnavailable
from tests.dsi.cli.procs import free_port
from tests.roles.cluster import Client, Cluster, cluster_config, reference_outputs
from tests.roles.test_disaggregation import assert_no_leaks
from tests.roles.test_prefix_cache_cluster import in_process, wait_blocks, wait_states

pytestmark = pytest.mark.slow

BS = 128
# Streams are long enough to be killed mid-way (a kill follows their 4th token) and to hold the
# UNPINNED tokens; every token more is only decoded three times over (run, re-run, reference).
GREEDY = SamplingParams(max_tokens=64, temperature=0.0)
# The bounded-hit cases' stream must outlast another request (and its pages' persistence) first.
LONG = SamplingParams(max_tokens=96, temperature=0.0)
# Tokens of the control request that shows the pin mattered (greedy: a prefix of the run). Its
# output leaves the pinned one's at token 0 (no hit, exact hit) or 14 (bounded 256 vs 512).
UNPINNED = 16


def add_decode(config: Path, role_id: str) -> None:
    config.write_text(
        config.read_text() + f'\n[[roles]]\nkind = "decode"\nid = "{role_id}"\n'
        f'bind = "tcp://127.0.0.1:{free_port()}"\n'
    )


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 20_000) for _ in range(n)]


class Stream:
    """One request through the router, running in the background; its tokens as they arrive."""

    def __init__(
        self,
        client: Client,
        request_id: str,
        token_ids: list[int],
        sampling: SamplingParams = GREEDY,
        hit_policy: HitPolicy | None = None,
    ) -> None:
        self.tokens: list[int] = []
        self.finish = ""
        msg = Generate(request_id, token_ids, sampling, hit_policy=hit_policy)
        self.task = asyncio.create_task(self._run(client, msg))

    async def _run(self, client: Client, msg: Generate) -> list[int]:
        async for chunk in client.pool.generate(msg):
            self.tokens += chunk.token_ids
            self.finish = chunk.finish or self.finish
        return self.tokens

    async def until(self, n: int, timeout: float = 60.0) -> None:
        for _ in range(int(timeout / 0.01)):
            if len(self.tokens) >= n:
                return
            if self.task.done():
                raise AssertionError(f"finished with {len(self.tokens)} tokens: {self.task.result()}")
            await asyncio.sleep(0.01)
        raise AssertionError(f"only {len(self.tokens)} tokens in {timeout}s")

    async def result(self, timeout: float = 120.0) -> list[int]:
        await asyncio.wait_for(self.task, timeout)
        assert self.finish in ("length", "stop"), self.finish
        return self.tokens


async def holders(client: Client, decodes: tuple[str, ...]) -> list[str]:
    return [d for d in decodes if (await client.stats(d)).running]


async def test_a_first_run_without_a_hit_is_rerun_without_one_though_its_pages_reached_the_store(
    procs, tmp_path
):
    cluster = Cluster(
        cluster_config(tmp_path, keep=("controller-0", "kvstore-0", "prefill-0", "decode-0", "decode-1")),
        procs,
    )
    cluster.start()
    p = prompt(3, 600)  # 4 full pages: a later run takes a bounded hit of 512 (no state at 384)
    expected = reference_outputs([p], GREEDY.max_tokens)[0]
    async with Client(cluster) as client:
        s = Stream(client, "a", p)
        await s.until(4)
        await wait_blocks(cluster, 4)  # the decode persisted the prompt's pages meanwhile
        cluster.kill((await holders(client, ("decode-0", "decode-1")))[0])
        assert await s.result() == expected
        rerun = await client.stats("prefill-0")
        unpinned = await client.generate("b", p, UNPINNED)  # the same prompt, now
        fresh = await client.stats("prefill-0")
    assert (rerun.prefills, rerun.cached_tokens) == (2, 0)  # the re-run took no hit either
    assert fresh.cached_tokens == 4 * BS and fresh.replay_tokens > 0  # unpinned: the bounded hit
    assert unpinned != expected[:UNPINNED]  # which answers otherwise: a re-run without the pin would splice


async def test_a_first_run_with_an_exact_hit_is_rerun_hit_free_when_the_state_died_with_its_decode(
    procs, tmp_path
):
    cluster = Cluster(
        cluster_config(tmp_path, keep=("controller-0", "kvstore-0", "prefill-0", "decode-0", "decode-1")),
        procs,
    )
    cluster.start("controller-0", "kvstore-0", "prefill-0", "decode-0")  # decode-1 comes later
    first = prompt(9, 600)
    async with Client(cluster) as client:
        client.pool.reroute_wait_s = 60.0  # the re-run waits for decode-1 to start
        out_a = await client.generate("a", first, 100)  # decode-0 reaches boundary 640 and keeps its state
        await wait_blocks(cluster, 5)
        await wait_states(cluster, 1)  # kept when "a" finished, announced soon after
        second = first + out_a[:100] + [21, 22, 23, 24] * 50  # 900 tokens: an exact hit ends at 640
        expected = reference_outputs([second], GREEDY.max_tokens)[0]  # the hit-free output
        s = Stream(client, "b", second)
        await s.until(4)
        exact = await client.stats("prefill-0")
        cluster.kill("decode-0")  # the request and the SWA state at 640 die together
        await asyncio.to_thread(cluster.start, "decode-1")
        assert await s.result() == expected
        rerun = await client.stats("prefill-0")
        unpinned = await client.generate("c", second, UNPINNED)
        fresh = await client.stats("prefill-0")
    assert (exact.states_pulled, exact.cached_tokens) == (1, 5 * BS)  # the first run: exact 640
    assert (rerun.prefills, rerun.cached_tokens) == (3, 5 * BS)  # the re-run: no hit (no state to pull)
    assert (
        fresh.cached_tokens - rerun.cached_tokens == 7 * BS and fresh.replay_tokens > 0
    )  # unpinned: bounded
    assert unpinned != expected[:UNPINNED]


async def test_a_first_run_with_a_bounded_hit_is_rerun_with_the_same_hit_though_the_store_now_holds_more(
    procs, tmp_path
):
    cluster = Cluster(
        cluster_config(tmp_path, keep=("controller-0", "kvstore-0", "prefill-0", "decode-0", "decode-1")),
        procs,
    )
    cluster.start()
    q = prompt(11, 400)  # its run stores 3 pages and keeps SWA states at 384 only
    p = q[:300] + prompt(12, 300)  # shares 2 pages with q: a bounded hit of 256 (no state at 256)
    r = p[:520] + prompt(13, 180)  # computed hit-free (exact policy, no state): stores p's first 4 pages
    sampling = LONG
    async with Client(cluster) as client:
        await client.generate("q", q, 2)
        await wait_blocks(cluster, 3)
        s = Stream(client, "p", p, sampling)
        await s.until(4)
        first = await client.stats("prefill-0")
        await client.generate("r", r, 2, hit_policy="exact")
        await wait_blocks(cluster, 6)  # p's pages up to 512 are in the store now
        assert not s.task.done()
        cluster.kill((await holders(client, ("decode-0", "decode-1")))[0])
        got = await s.result()
        rerun = await client.stats("prefill-0")
        unpinned = await client.generate("p2", p, UNPINNED)
        fresh = await client.stats("prefill-0")
    _, expected = in_process(q, 2, p, sampling.max_tokens, hit=2 * BS)  # p's output with a bounded hit of 256
    assert got == expected
    assert first.cached_tokens == 2 * BS and first.states_pulled == 0
    assert rerun.cached_tokens - first.cached_tokens == 2 * BS  # r: none; the re-run: 256 again
    assert fresh.cached_tokens - rerun.cached_tokens == 4 * BS  # unpinned: bounded 512
    assert unpinned != expected[:UNPINNED]


async def test_a_rerun_whose_bounded_hit_is_gone_ends_with_hit_unavailable_after_the_tokens_sent(
    procs, tmp_path
):
    cluster = Cluster(
        cluster_config(tmp_path, keep=("controller-0", "kvstore-0", "prefill-0", "decode-0", "decode-1")),
        procs,
    )
    cluster.start()
    q = prompt(11, 400)
    p = q[:300] + prompt(12, 300)  # a bounded hit of 256 (see the test above)
    async with Client(cluster) as client:
        await client.generate("q", q, 2)
        await wait_blocks(cluster, 3)
        s = Stream(client, "p", p, LONG)
        await s.until(4)
        holder = (await holders(client, ("decode-0", "decode-1")))[0]
        cluster.kill("kvstore-0")  # the pages of its hit are gone with the store
        cluster.kill(holder)
        with pytest.raises(HitUnavailable, match="bounded-replay hit of 256"):
            await asyncio.wait_for(s.task, 60)
        survivors = ("prefill-0", *(d for d in ("decode-0", "decode-1") if d != holder))
        await assert_no_leaks(client, survivors)
    _, expected = in_process(q, 2, p, LONG.max_tokens, hit=2 * BS)  # the case above's, computed once
    assert 4 <= len(s.tokens) < len(expected) and s.tokens == expected[: len(s.tokens)]  # sent: a prefix
