"""Prefix hits in the gateway: blocks put into a real kvstore reach the entrypoint's CHECK replica,
and a request with that prefix carries them as a prediction (Generate, metrics); usage reports
what the engine reused; the kvstore is found through the controller; with no kvstore the
gateway serves with hit 0; the request's hit policy (metadata, else the cluster's) reaches
Generate and shapes the prediction."""

import asyncio
import re

import pytest
import zmq.asyncio
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from dsi.config import ClusterConfig
from dsi.errors import BadMessage
from dsi.kvcache.hashchain import HashChain
from dsi.messages import ALL
from dsi.messages.control import Heartbeat
from dsi.messages.gateway import Generate
from dsi.messages.kvstore import GetIndexInfo
from dsi.model.config import TINY
from dsi.model.hits import exact_hit_limit, max_hit
from dsi.recipe import ModelVersion, Recipe
from dsi.roles.controller import ControllerActor
from dsi.roles.entrypoint.app import make_app
from dsi.roles.entrypoint.auth import ApiKeys
from dsi.roles.entrypoint.gateway import Gateway
from dsi.roles.entrypoint.metrics import Metrics
from dsi.roles.entrypoint.prefix import PrefixLookup
from dsi.roles.entrypoint.prepare import Preparer
from dsi.transport.client import Peer
from dsi.transport.server import ActorServer
from dsi.transport.wire import Codec
from tests.roles.entrypoint.fakes import FakePool
from tests.roles.kvstore.conftest import Clock, Kvstores, block_bytes, put_msg
from tests.transport.procs import free_address

CHAIN = HashChain.of(TINY, root_seed=5)
KEEP = 140  # the tiny model's decoder-side keep
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
LONG = "the quick brown fox jumps over the lazy dog " * 60  # about 600 tokens: 4 full blocks
BODIES = {  # each its own prompt (the three protocols render the same text alike)
    "chat": {"model": "dsi-tiny", "messages": [{"role": "user", "content": "chat " + LONG}], "max_tokens": 2},
    "responses": {"model": "dsi-tiny", "input": "responses " + LONG, "max_output_tokens": 2},
    "messages": {
        "model": "dsi-tiny",
        "messages": [{"role": "user", "content": "messages " + LONG}],
        "max_tokens": 2,
    },
}


def cached_in_usage(protocol: str, body: dict) -> int:
    usage = body["usage"]
    if protocol == "chat":
        return usage["prompt_tokens_details"]["cached_tokens"]
    if protocol == "responses":
        return usage["input_tokens_details"]["cached_tokens"]
    return usage["cache_read_input_tokens"]


@pytest.fixture(scope="module")
def recipe():
    return Recipe({"dsi-tiny": ModelVersion.V4})


@pytest.fixture
async def ctx():
    context = zmq.asyncio.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
async def kvstores(tmp_path, ctx):
    group = Kvstores(ctx, tmp_path / "store", Clock())
    yield group
    await group.stop_all()


async def _gateway(recipe, prefix: PrefixLookup | None, pool: FakePool, keys: ApiKeys | None = None):
    gateway = Gateway(pool, keys or ApiKeys.load(None), Metrics(), Preparer(recipe, 16_384), prefix)
    server = TestServer(make_app(gateway, ["dsi-tiny"], 1 << 20), host="127.0.0.1")
    await server.start_server()
    return server


async def _synced(prefix: PrefixLookup, peer: Peer) -> None:
    info = await peer.ask(GetIndexInfo())
    async with asyncio.timeout(20):
        while prefix.replica is None:
            await asyncio.sleep(0.02)
    await prefix.replica.wait_seq(info.epoch, info.seq)


async def test_blocks_in_the_kvstore_are_reported_as_cached_tokens(recipe, kvstores, ctx):
    run = await kvstores.start(publish_interval_s=0.2)
    prefix = PrefixLookup(CHAIN, None, ctx, address=run.address, refresh_s=0.1)
    await prefix.start()
    pool = FakePool()
    server = await _gateway(recipe, prefix, pool)
    try:
        async with ClientSession() as http:
            for protocol, body in BODIES.items():
                async with http.post(server.make_url(PATHS[protocol]), json=body) as resp:
                    assert resp.status == 200 and cached_in_usage(protocol, await resp.json()) == 0
                ids = pool.requests[-1].token_ids
                assert len(ids) >= 3 * 128 and pool.requests[-1].cached_tokens == 0
                hashes = CHAIN.hashes(ids)
                await run.peer.ask(put_msg(hashes[: 2 * 16], block_bytes(2)))  # the first two blocks
                await _synced(prefix, run.peer)
                async with http.post(server.make_url(PATHS[protocol]), json=body) as resp:
                    answer = await resp.json()
                    assert resp.status == 200 and cached_in_usage(protocol, answer) == 256, answer
                assert pool.requests[-1].cached_tokens == 256  # the fake engine reuses all of it
            # a stream reports it too (chat with include_usage)
            body = {**BODIES["chat"], "stream": True, "stream_options": {"include_usage": True}}
            async with http.post(server.make_url(PATHS["chat"]), json=body) as resp:
                assert '"cached_tokens":256' in (await resp.text()).replace(" ", "")
            async with http.get(server.make_url("/metrics")) as resp:
                text = await resp.text()
        lookups = sum(len(r.token_ids) for r in pool.requests)
        assert f"dsi_prefix_lookup_tokens_total {lookups}" in text
        assert "dsi_prefix_hit_tokens_total 1024" in text  # 3 protocols + the stream, 256 each
        assert "dsi_kv_replica_blocks 6" in text and "dsi_kv_replica_synced 1" in text
        # the first snapshot; a loaded host can lose a delta to the subscription's start and resync
        resyncs = int(re.search(r"(?m)^dsi_kv_replica_resyncs_total (\d+)$", text).group(1))  # type: ignore[union-attr]
        assert 1 <= resyncs <= prefix.replica.state.resyncs
    finally:
        await server.close()
        await prefix.close()


STREAM_USAGE = {
    "chat": '"cached_tokens":{}',
    "responses": '"cached_tokens":{}',
    "messages": '"cache_read_input_tokens":{}',
}


async def test_usage_reports_what_the_engine_reused_not_the_prediction(recipe, kvstores, ctx):
    """The replica holds two blocks of the prompt, the engine reused one (the second was
    corrupt, say): usage says 128 in every protocol, streamed or not; the metrics keep both."""
    run = await kvstores.start(publish_interval_s=0.2)
    prefix = PrefixLookup(CHAIN, None, ctx, address=run.address, refresh_s=0.1)
    await prefix.start()
    pool = FakePool(engine_cached=0)
    server = await _gateway(recipe, prefix, pool)
    try:
        async with ClientSession() as http:
            for protocol, body in BODIES.items():
                pool.engine_cached = 0
                async with http.post(server.make_url(PATHS[protocol]), json=body) as resp:
                    assert resp.status == 200 and cached_in_usage(protocol, await resp.json()) == 0
                await run.peer.ask(
                    put_msg(CHAIN.hashes(pool.requests[-1].token_ids)[: 2 * 16], block_bytes(2))
                )
                await _synced(prefix, run.peer)
                pool.engine_cached = 128
                async with http.post(server.make_url(PATHS[protocol]), json=body) as resp:
                    answer = await resp.json()
                    assert resp.status == 200 and cached_in_usage(protocol, answer) == 128, answer
                assert pool.requests[-1].cached_tokens == 256
                streamed = {**body, "stream": True}
                if protocol == "chat":
                    streamed["stream_options"] = {"include_usage": True}
                async with http.post(server.make_url(PATHS[protocol]), json=streamed) as resp:
                    text = (await resp.text()).replace(" ", "")
                assert (
                    STREAM_USAGE[protocol].format(128) in text
                    and STREAM_USAGE[protocol].format(256) not in text
                )
            async with http.get(server.make_url("/metrics")) as resp:
                metrics = await resp.text()
        assert "dsi_prefix_hit_tokens_total 1536" in metrics  # 3 protocols x 2 requests x 256 predicted
        assert "dsi_engine_cached_tokens_total 768" in metrics  # x 128 reused
    finally:
        await server.close()
        await prefix.close()


async def test_the_kvstore_is_found_through_the_controller(kvstores, ctx):
    run = await kvstores.start()
    controller = ControllerActor("controller-t", ClusterConfig(controller="tcp://127.0.0.1:1"))
    server = ActorServer(controller, "tcp://127.0.0.1:*", ctx, role="controller")
    await server.start()
    beats = Peer(server.address, ctx, types=ALL)
    prefix = PrefixLookup(CHAIN, server.address, ctx, refresh_s=0.1)
    try:
        await beats.connect()
        await prefix.start()
        await asyncio.sleep(0.3)
        assert prefix.replica is None  # no kvstore registered yet: off, every lookup a miss
        beats.tell(Heartbeat("kvstore-0", "kvstore", "127.0.0.1", 1, run.address))
        ids = list(range(1000, 1000 + 3 * 128 + 5))
        await run.peer.ask(put_msg(CHAIN.hashes(ids), block_bytes(3)))
        await _synced(prefix, run.peer)
        assert prefix.address == run.address
        assert prefix.cached_tokens(ids) == 384
        assert prefix.cached_tokens(ids[:200]) == 128 and prefix.cached_tokens(ids[:100]) == 0
        assert prefix.cached_tokens(ids[:256]) == 128  # the last token is always computed
        assert prefix.cached_tokens(ids[:257]) == 256
        assert prefix.cached_tokens([7, *ids[1:]]) == 0  # another first block: another chain
    finally:
        await prefix.close()
        await beats.close()
        await server.stop()


async def test_a_fixed_kvstore_address_still_learns_the_vllm_engines_chain(kvstores, ctx):
    from dsi.vllm.chain import vllm_chain
    from tests.fingerprints import fingerprint

    run = await kvstores.start()
    controller = ControllerActor("controller-t", ClusterConfig(controller="tcp://127.0.0.1:1"))
    server = ActorServer(controller, "tcp://127.0.0.1:*", ctx, role="controller")
    await server.start()
    beats = Peer(server.address, ctx, types=ALL)
    vllm = fingerprint(engine="vllm 0.32 SmolLM2 float32 avx512")
    prefix = PrefixLookup(CHAIN, server.address, ctx, address=run.address, refresh_s=0.1)
    try:
        await beats.connect()
        await prefix.start()
        expected = vllm_chain(CHAIN.root_seed, CHAIN.model, vllm, CHAIN.block_size)
        for _ in range(50):  # ready, then serving: the controller's table lists it as serving
            beats.tell(Heartbeat("kvstore-x", "kvstore", "127.0.0.1", 2, free_address()))
            beats.tell(Heartbeat("decode-0", "decode", "127.0.0.1", 1, "tcp://127.0.0.1:9", fingerprint=vllm))
            await asyncio.sleep(0.1)
            if prefix.chain == expected and prefix.address == run.address:
                break
        assert prefix.chain == expected  # hashed on the vLLM engines' chain
        assert prefix.address == run.address  # the fixed kvstore, not the one the controller lists
    finally:
        await prefix.close()
        await beats.close()
        await server.stop()


async def test_the_gateway_serves_with_hit_zero_when_the_kvstore_is_down(recipe, ctx):
    prefix = PrefixLookup(CHAIN, None, ctx, address=free_address(), refresh_s=0.1, timeout=0.2)
    await prefix.start()
    pool = FakePool()
    server = await _gateway(recipe, prefix, pool)
    try:
        async with ClientSession() as http:
            for protocol, body in BODIES.items():
                async with http.post(server.make_url(PATHS[protocol]), json=body) as resp:
                    assert resp.status == 200 and cached_in_usage(protocol, await resp.json()) == 0
            async with http.get(server.make_url("/metrics")) as resp:
                text = await resp.text()
        assert "dsi_prefix_hit_tokens_total 0" in text and "dsi_kv_replica_synced 0" in text
        assert [r.cached_tokens for r in pool.requests] == [0, 0, 0]
    finally:
        await server.close()
        await prefix.close()


async def test_traffic_class_from_the_key_the_header_or_the_metadata(recipe, tmp_path):
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text('[[keys]]\nkey = "k1"\nname = "team"\ntraffic_class = "agent"\n')
    pool = FakePool()
    gateway = Gateway(pool, ApiKeys.load(keys_file), Metrics(), Preparer(recipe, 16_384))
    server = TestServer(make_app(gateway, ["dsi-tiny"], 1 << 20), host="127.0.0.1")
    await server.start_server()
    auth = {"Authorization": "Bearer k1"}
    chat = {"model": "dsi-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    try:
        async with ClientSession() as http:
            url = server.make_url(PATHS["chat"])
            async with http.post(url, json=chat, headers=auth) as resp:
                assert resp.status == 200
            async with http.post(url, json=chat, headers={**auth, "x-dsi-traffic-class": "chatbot"}) as resp:
                assert resp.status == 200
            body = {**chat, "metadata": {"traffic_class": "chatbot"}}
            async with http.post(url, json=body, headers=auth) as resp:
                assert resp.status == 200
            async with http.post(url, json=chat, headers={**auth, "x-dsi-traffic-class": "batch"}) as resp:
                assert resp.status == 400 and (await resp.json())["error"]["code"] == "invalid_traffic_class"
        assert [r.traffic_class for r in pool.requests] == ["agent", "chatbot", "chatbot"]
    finally:
        await server.close()


async def test_a_keys_cache_salt_namespaces_its_hits(recipe, kvstores, ctx, tmp_path):
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text(
        '[[keys]]\nkey = "k1"\nname = "shared"\n\n'
        '[[keys]]\nkey = "k2"\nname = "team-b"\ncache_salt = "team-b"\n'
    )
    run = await kvstores.start(publish_interval_s=0.2)
    prefix = PrefixLookup(CHAIN, None, ctx, address=run.address, refresh_s=0.1)
    await prefix.start()
    pool = FakePool()
    server = await _gateway(recipe, prefix, pool, ApiKeys.load(keys_file))
    url, body = server.make_url(PATHS["chat"]), BODIES["chat"]

    async def cached_for(key: str) -> int:
        async with http.post(url, json=body, headers={"Authorization": f"Bearer {key}"}) as resp:
            assert resp.status == 200
            return cached_in_usage("chat", await resp.json())

    try:
        async with ClientSession() as http:
            assert await cached_for("k1") == 0
            ids = pool.requests[-1].token_ids
            await run.peer.ask(put_msg(CHAIN.hashes(ids)[: 2 * 16], block_bytes(2)))  # shared chain only
            await _synced(prefix, run.peer)
            assert await cached_for("k1") == 256
            assert await cached_for("k2") == 0  # the salted chain shares nothing with the plain one
            assert (
                pool.requests[-1].sampling.cache_salt == "team-b"
                and pool.requests[-2].sampling.cache_salt == ""
            )
            await run.peer.ask(put_msg(CHAIN.hashes(ids, cache_salt="team-b")[: 3 * 16], block_bytes(3)))
            await _synced(prefix, run.peer)
            assert await cached_for("k2") == 384
    finally:
        await server.close()
        await prefix.close()


def _with_hit_policy(protocol: str, policy: str) -> dict:
    return {**BODIES[protocol], "metadata": {"hit_policy": policy}}


async def test_the_hit_policy_reaches_generate_from_the_metadata_or_the_cluster(recipe, kvstores, ctx):
    run = await kvstores.start(publish_interval_s=0.2)
    prefix = PrefixLookup(CHAIN, None, ctx, address=run.address, refresh_s=0.1)
    await prefix.start()
    pool = FakePool()
    gateway = Gateway(
        pool, ApiKeys.load(None), Metrics(), Preparer(recipe, 16_384, hit_policy="exact"), prefix, keep=KEEP
    )
    server = TestServer(make_app(gateway, ["dsi-tiny"], 1 << 20), host="127.0.0.1")
    await server.start_server()
    try:
        async with ClientSession() as http:
            for protocol in PATHS:
                url = server.make_url(PATHS[protocol])
                async with http.post(url, json=BODIES[protocol]) as resp:  # the cluster's policy
                    assert resp.status == 200
                ids = pool.requests[-1].token_ids
                stored = max_hit(len(ids), 128)
                await run.peer.ask(put_msg(CHAIN.hashes(ids[:stored]), block_bytes(stored // 128)))
                await _synced(prefix, run.peer)
                exact = exact_hit_limit(len(ids), KEEP, 128)
                assert 0 < exact < stored  # this prompt tells the two predictions apart
                for policy, hit in (("exact", exact), ("bounded", stored)):
                    async with http.post(url, json=_with_hit_policy(protocol, policy)) as resp:
                        answer = await resp.json()
                        assert resp.status == 200 and cached_in_usage(protocol, answer) == hit, answer
                    assert (pool.requests[-1].hit_policy, pool.requests[-1].cached_tokens) == (policy, hit)
                async with http.post(url, json=BODIES[protocol]) as resp:
                    assert resp.status == 200 and cached_in_usage(protocol, await resp.json()) == exact
                async with http.post(url, json=_with_hit_policy(protocol, "fast")) as resp:
                    error = await resp.json()
                    assert resp.status == 400, error
                if protocol == "messages":
                    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
                    assert error["error"]["message"].startswith("metadata.hit_policy: ")
                else:
                    assert (error["error"]["param"], error["error"]["code"]) == (
                        "metadata.hit_policy",
                        "invalid_hit_policy",
                    )
        assert [r.hit_policy for r in pool.requests] == ["exact", "exact", "bounded", "exact"] * 3
    finally:
        await server.close()
        await prefix.close()


def test_generate_carries_the_hit_policy_and_a_bad_one_is_refused_at_the_boundary():
    codec = Codec(ALL)
    for policy in (None, "bounded", "exact"):
        msg = Generate("r", [1, 2, 3], hit_policy=policy)
        assert codec.decode(codec.encode(msg)) == msg
    with pytest.raises(BadMessage, match="Invalid enum value 'fast'"):
        codec.decode(codec.encode(Generate("r", [1, 2, 3], hit_policy="fast")))  # type: ignore[arg-type]
