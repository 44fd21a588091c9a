"""Steady mixed load on a gateway: ``concurrency`` clients, each sending one request after another.

Each request is drawn (seeded) from four kinds, all chat completions with thinking off:

    stream     SSE, greedy, a short fresh prompt, 8-48 tokens
    complete   one JSON body, greedy, a short fresh prompt, 8-48 tokens
    shared     SSE, greedy, one of four long shared prefixes (~300 words) + a short question:
               prefix hits in the kvstore once the prefix was served
    seeded     SSE, temperature 0.8 with a fixed seed

A request fails when its status is not 200, a stream carries an error event or ends without
``[DONE]``, a body has no finish reason, or the connection fails; each result keeps its end
time (monotonic seconds) so that a failure can be set against the cluster's capacity then.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

import aiohttp

KINDS = ("stream", "complete", "shared", "seeded")
_WORDS = (
    "river",
    "stone",
    "lamp",
    "orbit",
    "cedar",
    "violet",
    "engine",
    "harbor",
    "quartz",
    "meadow",
    "signal",
    "copper",
    "lantern",
    "falcon",
    "glacier",
    "ember",
    "willow",
    "cobalt",
    "saffron",
    "tundra",
)


@dataclass(frozen=True, slots=True)
class RequestResult:
    kind: str
    started: float  # monotonic seconds
    ended: float
    error: str = ""  # empty: it succeeded


@dataclass(slots=True)
class LoadLog:
    results: list[RequestResult] = field(default_factory=list)

    def counts(self) -> dict[str, dict[str, int]]:
        """Per kind: requests ``ok`` and ``failed``."""
        out = {kind: {"ok": 0, "failed": 0} for kind in KINDS}
        for r in self.results:
            out[r.kind]["failed" if r.error else "ok"] += 1
        return out


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def draw_body(rng: random.Random, prefixes: list[str]) -> tuple[str, dict]:
    """One request of a random kind: (kind, chat completion body)."""
    kind = rng.choice(KINDS)
    text = f"{rng.choice(prefixes)}\nQuestion: {_words(rng, 6)}?" if kind == "shared" else _words(rng, 20)
    body: dict = {
        "model": "dsi-tiny",
        "max_tokens": rng.randrange(8, 48),
        "stream": kind != "complete",
        "temperature": 0.0,
        "thinking": {"type": "disabled"},
        "messages": [{"role": "user", "content": text}],
    }
    if kind == "seeded":
        body |= {"temperature": 0.8, "seed": rng.randrange(1 << 31)}
    return kind, body


async def _send(http: aiohttp.ClientSession, url: str, body: dict) -> str:
    """The failure of one request, or "" when it succeeded."""
    async with http.post(url, json=body) as resp:
        if resp.status != 200:
            return f"http {resp.status}: {(await resp.text())[:200]}"
        if not body["stream"]:
            reply = await resp.json()
            return "" if reply["choices"][0].get("finish_reason") else "no finish reason"
        done = False
        async for raw in resp.content:
            line = raw.decode().strip()
            if line.startswith("data: {") and '"error"' in line:
                return f"error event: {json.loads(line[6:]).get('error', {}).get('message', line)[:200]}"
            done = done or line == "data: [DONE]"
        return "" if done else "the stream ended without [DONE]"


async def _client(
    http: aiohttp.ClientSession,
    url: str,
    rng: random.Random,
    prefixes: list[str],
    stop: asyncio.Event,
    log: LoadLog,
) -> None:
    while not stop.is_set():
        kind, body = draw_body(rng, prefixes)
        started = time.monotonic()
        try:
            error = await _send(http, url, body)
        except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError, KeyError, IndexError) as exc:
            error = f"{type(exc).__name__}: {exc}"[:200]
        log.results.append(RequestResult(kind, started, time.monotonic(), error))
        if error:
            await asyncio.sleep(0.2)  # a failing cluster is not hammered in a tight loop


async def run_load(
    base_url: str,
    concurrency: int,
    stop: asyncio.Event,
    log: LoadLog,
    seed: int = 0,
    request_timeout_s: float = 120.0,
) -> None:
    """Send requests from `concurrency` clients until `stop` is set, appending to `log`."""
    rng = random.Random(seed)
    prefixes = [f"Document {i}: {_words(rng, 300)}" for i in range(4)]
    url = f"{base_url}/v1/chat/completions"
    timeout = aiohttp.ClientTimeout(total=request_timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        await asyncio.gather(
            *(
                _client(http, url, random.Random(seed * 1000 + i), prefixes, stop, log)
                for i in range(concurrency)
            )
        )
