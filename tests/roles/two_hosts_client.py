"""The client side of tests/roles/test_two_hosts.py, run inside host A's network namespace:
``python -m tests.roles.two_hosts_client CONFIG PLAN.json`` prints one JSON object.

PLAN: ``http`` (the entrypoint's ``HOST:PORT``), ``chat`` (one Chat Completions body), ``first``
(a token prompt), ``tail`` (the second prompt is ``first`` + its output + ``tail``, so its prefix
hit ends where the decode kept an SWA state), ``first_max`` / ``second_max``.

In order: the instance table; the chat request over HTTP (its SSE text); ``first`` then
``second`` through the gateway's router (DecodePool); the engines' and the kvstore's counters,
and the blocks the entrypoint's CHECK replica of the kvstore's index holds;
then the same calls without keys (a Drain of the decode to the controller, a PutBlocks and a
GetStats to the kvstore on the other host), each recorded as answered or not, and the instance
table and store counters again, with keys. The test decides what is right.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import aiohttp
import msgspec
import zmq.asyncio

from dsi.config import load_config
from dsi.engine.params import SamplingParams
from dsi.errors import DsiError
from dsi.messages import ALL
from dsi.messages.blob import Blob
from dsi.messages.control import Drain, ListInstances
from dsi.messages.gateway import Generate
from dsi.messages.handoff import GetEngineStats
from dsi.messages.kvstore import GetIndexInfo, GetStats, PutBlocks
from dsi.roles.curve import client_keys
from dsi.roles.entrypoint.backends import DecodePool
from dsi.transport.client import Peer
from dsi.transport.security import CurveKeys

NO_REPLY_S = 1.5  # an unauthorised ask waits this long for an answer that must not come


async def ask(
    ctx: zmq.asyncio.Context, address: str, msg: Any, keys: CurveKeys | None, timeout: float
) -> Any:
    peer = Peer(address, ctx, types=ALL, keys=keys, timeout=timeout, peer_id="two-hosts-client")
    try:
        async with asyncio.timeout(timeout):
            await peer.connect(timeout=timeout)
            return await peer.ask(msg, timeout=timeout)
    finally:
        await peer.close()


async def unanswered(ctx: zmq.asyncio.Context, address: str, msg: Any) -> bool:
    """True when ``msg`` sent without keys gets no answer (no reply, not even an error)."""
    try:
        await ask(ctx, address, msg, None, NO_REPLY_S)
    except (DsiError, TimeoutError):
        return True
    return False


def named(msg: Any) -> dict:
    """A message's fields by name (messages encode as arrays)."""
    return msgspec.to_builtins(msgspec.structs.asdict(msg))


def table(reply: Any) -> dict[str, dict]:
    return {i.instance_id: named(i) for i in reply.instances}


async def wait_serving(ctx: zmq.asyncio.Context, controller: str, keys: CurveKeys, ids: set[str]) -> dict:
    for _ in range(400):
        try:
            now = table(await ask(ctx, controller, ListInstances(), keys, 2.0))
        except (DsiError, TimeoutError):
            now = {}
        if ids <= {i for i, info in now.items() if info["state"] == "serving"}:
            return now
        await asyncio.sleep(0.1)
    raise AssertionError(f"not serving: {now}")


async def chat(http: str, body: dict) -> str:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        for _ in range(300):  # until the gateway knows a prefill and a decode
            async with session.get(f"http://{http}/health") as resp:
                if resp.status == 200:
                    break
            await asyncio.sleep(0.1)
        async with session.post(f"http://{http}/v1/chat/completions", json=body) as resp:
            return f"{resp.status}\n" + await resp.text()


async def replica_blocks(http: str, at_least: int) -> int:
    """The entrypoint's CHECK replica's block count (its /metrics), once it holds ``at_least``
    (it follows the kvstore on host B: a snapshot, then deltas), or the last count after 10 s."""
    blocks = -1
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        for _ in range(100):
            async with session.get(f"http://{http}/metrics") as resp:
                text = await resp.text()
            line = next((x for x in text.splitlines() if x.startswith("dsi_kv_replica_blocks ")), "")
            blocks = int(float(line.split()[1])) if line else -1
            if blocks >= at_least:
                break
            await asyncio.sleep(0.1)
    return blocks


async def generate(pool: DecodePool, request_id: str, prompt: list[int], max_tokens: int) -> list[int]:
    msg = Generate(request_id, prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    return [t async for chunk in pool.generate(msg) for t in chunk.token_ids]


async def run(config: str, plan: dict) -> dict:
    cfg = load_config(config)
    keys = client_keys(cfg.security)
    assert keys is not None, "the two-host test runs with CURVE on"
    controller = cfg.cluster.controller
    ctx = zmq.asyncio.Context()
    out: dict[str, Any] = {}
    try:
        ids = {"controller-0", "entrypoint-0", "prefill-0", "decode-0", "kvstore-0"}
        instances = await wait_serving(ctx, controller, keys, ids)
        out["instances"] = instances
        out["sse"] = await chat(plan["http"], plan["chat"])
        pool = DecodePool(controller, ctx, keys=keys, refresh_s=0.3, item_timeout_s=60.0)
        await pool.start()
        try:
            out["first"] = await generate(pool, "first", plan["first"], plan["first_max"])
            kvstore = instances["kvstore-0"]["address"]
            for _ in range(100):  # the decode announces its SWA state once "first" finished
                if (await ask(ctx, kvstore, GetStats(), keys, 5.0)).states >= 1:
                    break
                await asyncio.sleep(0.1)
            second = plan["first"] + out["first"] + plan["tail"]  # the hit ends at the first's state
            out["second"] = await generate(pool, "second", second, plan["second_max"])
        finally:
            await pool.close()
        for role in ("prefill-0", "decode-0"):
            reply = await ask(ctx, instances[role]["address"], GetEngineStats(), keys, 5.0)
            out[f"{role}.stats"] = named(reply)
        out["kvstore.before"] = named(await ask(ctx, kvstore, GetStats(), keys, 5.0))
        out["index"] = named(await ask(ctx, kvstore, GetIndexInfo(), keys, 5.0))
        out["replica.blocks"] = await replica_blocks(plan["http"], out["kvstore.before"]["blocks"])
        # Without keys: no answer, and nothing changes.
        out["unkeyed.drain"] = await unanswered(ctx, controller, Drain("decode-0", grace_s=0.0))
        put = PutBlocks([bytes(range(32))], [Blob.of(bytes(64))])
        out["unkeyed.put"] = await unanswered(ctx, kvstore, put)
        out["unkeyed.stats"] = await unanswered(ctx, kvstore, GetStats())
        await asyncio.sleep(2 * cfg.cluster.heartbeat_interval_s)  # a drain would show by now
        out["instances.after"] = table(await ask(ctx, controller, ListInstances(), keys, 5.0))
        out["kvstore.after"] = named(await ask(ctx, kvstore, GetStats(), keys, 5.0))
    finally:
        ctx.destroy(linger=0)
    return out


if __name__ == "__main__":
    with open(sys.argv[2]) as f:
        plan = json.load(f)
    print(json.dumps(asyncio.run(run(sys.argv[1], plan)), default=str))
