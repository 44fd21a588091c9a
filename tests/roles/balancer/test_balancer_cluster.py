"""Live: 2 prefill + 2 decode + a balancer behind the gateway. A mix of short and long prompts
shows the length buckets in ``dsi status --json``, and then every long prompt is prefilled by
the engine that serves the long bucket, every short one by the other.

Bucket edges are configured small (512 un-cached tokens) so that "long" is cheap on the tiny
model. Two processes: controller + balancer + entrypoint, and the four engines."""

from __future__ import annotations

import asyncio
import json
import random
import re

import aiohttp
import pytest
import zmq.asyncio

from dsi.cli.main import main
from dsi.messages import ALL
from dsi.messages.handoff import EngineStats, GetEngineStats
from dsi.transport.client import Peer
from tests.dsi.cli.procs import local_config, python_module
from tests.roles.cluster import role_addresses

pytestmark = pytest.mark.slow

FRONT = ("controller-0", "balancer-0", "entrypoint-0")
ENGINES = ("prefill-0", "prefill-1", "decode-0", "decode-1")
WORDS = ("alpha", "ledger", "quantum", "river", "garden", "compile", "orbit", "spice", "tensor", "harbor")


def _config(tmp_path):
    path = local_config(tmp_path, keep=FRONT + ENGINES, interval_s=0.3)
    text = path.read_text()
    text = re.sub(
        r'(?m)^(id = "balancer-0".*\nbind = .*)$',
        r"\1\nbucket_edges = [512, 4096, 16384]\nrebalance_s = 0.5",
        text,
    )
    text = re.sub(r"(?m)^(http = .*)$", r"\1\nbalancer_timeout_s = 2.0", text)  # a loaded CI machine
    path.write_text(text)
    return path


def _body(words: int, rng: random.Random) -> dict:
    return {
        "model": "dsi-tiny",
        "max_tokens": 2,
        "temperature": 0,
        "thinking": {"type": "disabled"},
        "messages": [{"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(words))}],
    }


async def _chat(session: aiohttp.ClientSession, base: str, body: dict) -> int:
    async with session.post(f"{base}/v1/chat/completions", json=body) as resp:
        data = await resp.json()
        assert resp.status == 200, data
        return data["usage"]["prompt_tokens"]


async def _buckets(config, capsys) -> list[dict] | None:
    """The first balancer's buckets from ``dsi status --json`` (run in a thread: it has its own loop)."""
    code = await asyncio.to_thread(main, ["status", "--json", "--config", str(config)])
    out = capsys.readouterr().out
    balancers = json.loads(out)["balancers"] if code == 0 else []
    return balancers[0]["buckets"] if balancers else None


async def _prefills(peers: dict[str, Peer]) -> dict[str, int]:
    stats: dict[str, EngineStats] = {i: await p.ask(GetEngineStats()) for i, p in peers.items()}
    return {i: s.prefills for i, s in stats.items()}


async def test_long_prompts_go_to_the_prefill_that_serves_the_long_bucket(procs, tmp_path, capsys):
    config = _config(tmp_path)
    addresses = role_addresses(config)
    base = "http://" + re.search(r'http = "([^"]+)"', config.read_text()).group(1)
    front = procs.start("front", python_module("dsi.cli.role", "--config", str(config), *_roles(FRONT)))
    engines = procs.start("engines", python_module("dsi.cli.role", "--config", str(config), *_roles(ENGINES)))
    front.wait_ready()
    engines.wait_ready()
    rng = random.Random(7)
    ctx = zmq.asyncio.Context()
    peers = {i: Peer(addresses[i], ctx, types=ALL, timeout=30) for i in ("prefill-0", "prefill-1")}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            await _wait_health(session, base)
            # Warm-up: the balancer measures both buckets; its plan is checked every 0.5 s.
            plan = None
            for _ in range(20):
                assert await _chat(session, base, _body(20, rng)) < 512
                assert await _chat(session, base, _body(600, rng)) >= 512
                buckets = await _buckets(config, capsys)
                if (
                    buckets
                    and len(buckets[0]["engines"]) == 1
                    and buckets[0]["engines"] != buckets[1]["engines"]
                ):
                    plan = buckets
                    break
            assert plan is not None, f"the buckets never split: {await _buckets(config, capsys)}"
            [short], [long] = plan[0]["engines"], plan[1]["engines"]
            assert plan[0]["max_tokens"] == 512 and plan[1]["min_tokens"] == 512
            for p in peers.values():
                await p.connect()
            before = await _prefills(peers)
            for _ in range(2):
                assert await _chat(session, base, _body(600, rng)) >= 512
            after_long = await _prefills(peers)
            for _ in range(2):
                assert await _chat(session, base, _body(20, rng)) < 512
            after_short = await _prefills(peers)
            assert after_long[long] - before[long] == 2 and after_long[short] == before[short]
            assert after_short[short] - after_long[short] == 2 and after_short[long] == after_long[long]
            assert [b["engines"] for b in (await _buckets(config, capsys))[:2]] == [
                [short],
                [long],
            ]  # the plan held
            # The gateway fetches the balancer's view every second: the split shows within a few.
            split = 'dsi_balancer_bucket_engines{balancer="balancer-0",bucket="1"} 1'
            for _ in range(50):
                async with session.get(f"{base}/metrics") as resp:
                    metrics = await resp.text()
                if split in metrics:
                    break
                await asyncio.sleep(0.1)
            assert 'dsi_route_total{role="prefill",source="table"}' in metrics  # the default route_mode
            assert split in metrics, [line for line in metrics.splitlines() if "dsi_balancer" in line]
    finally:
        for p in peers.values():
            await p.close()
        ctx.destroy(linger=0)


def _roles(ids: tuple[str, ...]) -> list[str]:
    return [arg for i in ids for arg in ("--role", i)]


async def _wait_health(session: aiohttp.ClientSession, base: str) -> None:
    for _ in range(300):
        try:
            async with session.get(f"{base}/health") as resp:
                health = await resp.json()
                if health.get("instances", 0) >= 2 and health.get("prefill_instances", 0) >= 2:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    raise AssertionError("the gateway never saw two prefill and two decode instances")
