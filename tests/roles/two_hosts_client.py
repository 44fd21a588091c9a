"""The client side of tests/roles/test_two_hosts.py, run inside host A's network namespace:
``python -m tests.roles.two_hosts_client CONFIG PLAN.json`` prints one JSON object.

PLAN: ``http`` (the entrypoint's ``HOST:PORT``), ``chat`` (one Chat Completions body), ``first``
(a token prompt), ``tail`` (the second prompt is ``first`` + its output + ``tail``, so its prefix
hit ends where the decode kept an SWA state), ``first_max`` / ``second_max``.

In order: the instance table; the chat request over HTTP (its SSE text); ``first``
through the gateway's router (DecodePool); intruders at the live engines (``engine_intruders``):
the data plane of prefill-0 (host A) and of decode-0 (host B) and their control planes, each
engine's counters before and after; ``second``, the next handoff and state pull over those data
planes; the engines' and the kvstore's counters, and the blocks the entrypoint's CHECK replica of
the kvstore's index holds; intruders at the controller (A) and the kvstore (B): its requests,
its blocks and its delta publisher (``cluster_intruders``); then, with keys, the instance table,
the store's counters and an attacked block's bytes again. Every intruder's outcome is recorded
(tests.roles.intruders); the test decides what is right.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import time
from typing import Any

import aiohttp
import msgspec
import zmq.asyncio

from dsi.config import load_config
from dsi.engine.params import SamplingParams
from dsi.errors import DsiError
from dsi.messages import ALL
from dsi.messages.blob import Blob
from dsi.messages.control import Drain, Heartbeat, ListInstances
from dsi.messages.gateway import Generate
from dsi.messages.handoff import GetEngineStats, Handoff, KvLease, PullState
from dsi.messages.kvstore import GetBlocks, GetIndexInfo, GetStats, MatchPrefix, PutBlocks, Snapshot
from dsi.roles.curve import client_keys
from dsi.roles.entrypoint.backends import DecodePool
from dsi.transport.client import Peer
from dsi.transport.kv import wire
from dsi.transport.security import CurveKeys
from dsi.transport.wire import Codec, Kind, pack_header
from tests.roles.intruders import (
    call,
    deltas_heard,
    forged_hello,
    forged_record,
    frames,
    hello_replayed,
    intruder_keys,
    push,
    raw_garbage,
    raw_zmtp,
)


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
                # 200 needs a decode only: without a prefill yet, the decode would prefill itself
                if resp.status == 200 and (await resp.json())["prefill_instances"] >= 1:
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


async def outcomes(probes: dict[str, Any]) -> dict[str, Any]:
    """Every probe (a coroutine) run at once: its outcome by name."""
    return dict(zip(probes, await asyncio.gather(*probes.values()), strict=True))


def control_frames(msg: Any) -> list[bytes]:
    """``msg`` as a caller's ASK puts it on the wire (header frame, body frames)."""
    return [pack_header(Kind.ASK, 1), *(bytes(f) for f in Codec(list(ALL)).encode(msg))]


async def engine_intruders(ctx: zmq.asyncio.Context, instances: dict, keys: CurveKeys) -> dict:
    """At prefill-0 and decode-0, at once: the probes' outcomes, and each engine's counters before
    and after them. Two probes must succeed: a push with the cluster's keys (refused: no such
    transfer) and a first Hello, which show the probes reach live keyed data planes."""
    admitted, stranger = intruder_keys(keys.server_public), intruder_keys(None)
    roles = ("prefill-0", "decode-0")
    before = {r: named(await ask(ctx, instances[r]["address"], GetEngineStats(), keys, 5.0)) for r in roles}

    def probes(role: str) -> dict[str, Any]:
        control, data = instances[role]["address"], before[role]["data_address"]
        lease_id = f"intruder-{os.urandom(16).hex()}"
        chunk = [wire.encode(wire.Chunk(lease_id, 0, 4096, 0)), os.urandom(4096)]
        lease = KvLease(lease_id, "tcp", "tcp://127.0.0.1:9", 4096, 1, 5.0)
        request = Generate("intruder", [5, 6, 7], SamplingParams(max_tokens=1))
        return {
            "push, no keys": push(data, None, lease_id),
            "push, an unadmitted client key": push(data, admitted, lease_id),
            "push, a made-up server key": push(data, stranger, lease_id),
            "push, the cluster's keys": push(data, keys, lease_id),
            "a clear chunk's frames": frames(ctx, data, chunk),
            "a forged hello": frames(ctx, data, [forged_hello()]),
            "a forged record": frames(ctx, data, forged_record()),
            "a hello, then replayed": hello_replayed(ctx, data, keys),
            "random bytes": raw_garbage(data),
            "a chunk over zmtp by hand": raw_zmtp(data, chunk),
            "pull a state, no keys": call(ctx, control, PullState(bytes(16), lease), None),
            "pull a state, an unadmitted client key": call(
                ctx, control, PullState(bytes(16), lease), admitted
            ),
            "a handoff, no keys": call(ctx, control, Handoff(request, control), None, stream=True),
            "stats, an unadmitted client key": call(ctx, control, GetEngineStats(), admitted),
            "control plane: random bytes": raw_garbage(control),
            "control plane: zmtp by hand": raw_zmtp(control, control_frames(GetEngineStats())),
        }

    found = dict(zip(roles, await asyncio.gather(*(outcomes(probes(r)) for r in roles)), strict=True))
    after = {r: named(await ask(ctx, instances[r]["address"], GetEngineStats(), keys, 5.0)) for r in roles}
    return {r: {"before": before[r], "probes": found[r], "after": after[r]} for r in roles}


async def block_digest(ctx: zmq.asyncio.Context, kvstore: str, block_hash: bytes, keys: CurveKeys) -> str:
    reply = await ask(ctx, kvstore, GetBlocks([block_hash]), keys, 5.0)
    assert reply.found == [True], reply.found
    return hashlib.sha256(reply.data[0].buffer).hexdigest()


async def first_stored(ctx: zmq.asyncio.Context, kvstore: str, keys: CurveKeys) -> bytes:
    """The hash of a block the store holds (from its snapshot)."""
    peer = Peer(kvstore, ctx, types=ALL, keys=keys, timeout=5.0, peer_id="two-hosts-client")
    try:
        await peer.connect()
        async for chunk in peer.stream(Snapshot()):
            if chunk.keys:
                return chunk.keys[:16]
    finally:
        await peer.close()
    raise AssertionError("the kvstore holds no block")


async def cluster_intruders(
    ctx: zmq.asyncio.Context,
    controller: str,
    kvstore: str,
    publish: str,
    keys: CurveKeys,
    held: bytes,
    fresh: bytes,
) -> dict:
    """At the controller and the kvstore (its requests and its delta publisher), at once: the
    probes' outcomes, and the deltas a subscriber hears with each kind of key (the cluster's
    must hear some: the probes reach a live publisher)."""
    admitted, stranger = intruder_keys(keys.server_public), intruder_keys(None)
    junk = Blob.of(os.urandom(4096))
    put = PutBlocks([held, fresh], [junk, junk])  # overwrite a block the store holds, add one
    beat = Heartbeat("intruder-0", "decode", "10.9.9.9", 1, "tcp://10.9.9.9:7120")
    drain = Drain("decode-0", grace_s=0.0)
    probes = {
        "controller: drain, no keys": call(ctx, controller, drain, None),
        "controller: drain, an unadmitted client key": call(ctx, controller, drain, admitted),
        "controller: drain, a made-up server key": call(ctx, controller, drain, stranger),
        "controller: a heartbeat, an unadmitted client key": call(ctx, controller, beat, admitted),
        "controller: random bytes": raw_garbage(controller),
        "controller: zmtp by hand": raw_zmtp(controller, control_frames(drain)),
        "kvstore: put, no keys": call(ctx, kvstore, put, None),
        "kvstore: put, an unadmitted client key": call(ctx, kvstore, put, admitted),
        "kvstore: get blocks, no keys": call(ctx, kvstore, GetBlocks([held]), None),
        "kvstore: get blocks, an unadmitted client key": call(ctx, kvstore, GetBlocks([held]), admitted),
        "kvstore: snapshot, a made-up server key": call(ctx, kvstore, Snapshot(), stranger, stream=True),
        "kvstore: stats, no keys": call(ctx, kvstore, GetStats(), None),
        "kvstore: random bytes": raw_garbage(kvstore),
        "kvstore: zmtp by hand": raw_zmtp(kvstore, control_frames(put)),
        "deltas heard, no keys": deltas_heard(ctx, publish, None),
        "deltas heard, an unadmitted client key": deltas_heard(ctx, publish, admitted),
        "deltas heard, the cluster's keys": deltas_heard(ctx, publish, keys),
    }
    return await outcomes(probes)


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
            # Intruders at the live engines; "second" is the next handoff and state pull after them.
            started = time.monotonic()
            out["intruders.engines"] = await engine_intruders(ctx, instances, keys)
            out["intruders.seconds"] = [time.monotonic() - started]
            second = plan["first"] + out["first"] + plan["tail"]  # the hit ends at the first's state
            out["second"] = await generate(pool, "second", second, plan["second_max"])
        finally:
            await pool.close()
        # The decode may stream a short answer before the prefill's send of its state returns and
        # counts the handoff: wait (up to 5 s) until the prefill has counted all three.
        for _ in range(50):
            reply = await ask(ctx, instances["prefill-0"]["address"], GetEngineStats(), keys, 5.0)
            if reply.handoffs + reply.failed_handoffs >= 3:
                break
            await asyncio.sleep(0.1)
        for role in ("prefill-0", "decode-0"):
            reply = await ask(ctx, instances[role]["address"], GetEngineStats(), keys, 5.0)
            out[f"{role}.stats"] = named(reply)
        out["kvstore.before"] = named(await ask(ctx, kvstore, GetStats(), keys, 5.0))
        out["index"] = named(await ask(ctx, kvstore, GetIndexInfo(), keys, 5.0))
        out["replica.blocks"] = await replica_blocks(plan["http"], out["kvstore.before"]["blocks"])
        # Intruders at the controller and the kvstore: no answer, and nothing changes.
        held = await first_stored(ctx, kvstore, keys)
        out["block.before"] = await block_digest(ctx, kvstore, held, keys)
        publish = out["index"]["publish"]
        fresh = os.urandom(16)  # a block an intruder's put would add
        started = time.monotonic()
        out["intruders.cluster"] = await cluster_intruders(
            ctx, controller, kvstore, publish, keys, held, fresh
        )
        await asyncio.sleep(cfg.cluster.heartbeat_interval_s)  # with the probes' time: a drain would show
        out["intruders.seconds"].append(time.monotonic() - started)
        out["instances.after"] = table(await ask(ctx, controller, ListInstances(), keys, 5.0))
        out["kvstore.after"] = named(await ask(ctx, kvstore, GetStats(), keys, 5.0))
        out["block.after"] = await block_digest(ctx, kvstore, held, keys)
        out["fresh.matched"] = (await ask(ctx, kvstore, MatchPrefix([fresh]), keys, 5.0)).hit_blocks
    finally:
        ctx.destroy(linger=0)
    return out


if __name__ == "__main__":
    with open(sys.argv[2]) as f:
        plan = json.load(f)
    print(json.dumps(asyncio.run(run(sys.argv[1], plan)), default=str))
