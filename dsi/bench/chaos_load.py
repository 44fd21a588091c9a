"""Greedy load whose every completed answer can be checked against a reference, token for token.

A pool of ``size`` prompts (seeded): half short (20 words, no full 128-token block), half a long
shared document (~250 words: prefix hits and blocks persisted to the kvstore) + a short question;
each with its own ``max_tokens`` (8-40), greedy, thinking off; three in four streamed (SSE), the
rest one JSON body. ``reference`` sends each once on the undisturbed cluster and keeps the text;
``run_load`` has ``concurrency`` clients send the pool round-robin until stopped.

With ``batch_invariant = true`` and ``hit_policy = "exact"`` the cluster's greedy text of a
prompt does not depend on its batch, its instance or a prefix hit, so a completed answer that
differs from the reference is *spliced*: tokens were lost, doubled or taken from another run.
A request *fails* when its status is not 200, a stream carries an error event or ends without
``[DONE]``, a body has no finish reason, or the connection fails (``error`` says which).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

import aiohttp

_WORDS = ("river", "stone", "lamp", "orbit", "cedar", "violet", "engine", "harbor", "quartz", "meadow",
          "signal", "copper", "lantern", "falcon", "glacier", "ember")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Prompt:
    body: dict  # chat completion request


@dataclass(frozen=True, slots=True)
class Answer:
    prompt: int  # index into the pool
    started: float  # monotonic seconds
    ended: float
    error: str = ""  # "": it completed
    text: str = ""  # the completed answer's content
    spliced: bool = False  # completed, and differs from the reference


@dataclass(slots=True)
class AnswerLog:
    answers: list[Answer] = field(default_factory=list)


def prompt_pool(size: int, seed: int = 0) -> list[Prompt]:
    rng = random.Random(seed)
    words = lambda n: " ".join(rng.choice(_WORDS) for _ in range(n))  # noqa: E731
    docs = [f"Document {i}: {words(250)}" for i in range(3)]
    pool = []
    for i in range(size):
        text = f"{docs[i % 3]}\nQuestion: {words(6)}?" if i % 2 else words(20)
        pool.append(
            Prompt(
                {
                    "model": "dsi-tiny",
                    "max_tokens": rng.randrange(8, 41),
                    "stream": i % 4 != 3,
                    "temperature": 0.0,
                    "thinking": {"type": "disabled"},
                    "messages": [{"role": "user", "content": text}],
                }
            )
        )
    return pool


async def send(http: aiohttp.ClientSession, url: str, body: dict) -> tuple[str, str]:
    """(error, text) of one request; error "" when it completed."""
    async with http.post(url, json=body) as resp:
        if resp.status != 200:
            return f"http {resp.status}: {(await resp.text())[:200]}", ""
        if not body["stream"]:
            reply = await resp.json()
            choice = reply["choices"][0]
            if not choice.get("finish_reason"):
                return "no finish reason", ""
            return "", choice["message"].get("content") or ""
        parts, done = [], False
        async for raw in resp.content:
            line = raw.decode().strip()
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: {"):
                event = json.loads(line[6:])
                if "error" in event:
                    return f"error event: {str(event['error'].get('message', event))[:200]}", ""
                for choice in event.get("choices", ()):
                    parts.append((choice.get("delta") or {}).get("content") or "")
        return ("", "".join(parts)) if done else ("the stream ended without [DONE]", "")


async def _one(http: aiohttp.ClientSession, url: str, body: dict) -> tuple[str, str]:
    try:
        return await send(http, url, body)
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError, KeyError, IndexError) as exc:
        return f"{type(exc).__name__}: {exc}"[:200], ""


async def reference(
    base_url: str, pool: list[Prompt], concurrency: int, timeout_s: float = 120.0
) -> list[str]:
    """The text of each prompt on the undisturbed cluster; RuntimeError if one fails."""
    url = f"{base_url}/v1/chat/completions"
    gate = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as http:

        async def one(p: Prompt) -> str:
            async with gate:
                error, text = await _one(http, url, p.body)
            if error:
                raise RuntimeError(f"the reference run failed: {error}")
            return text

        return list(await asyncio.gather(*(one(p) for p in pool)))


async def run_load(
    base_url: str,
    pool: list[Prompt],
    expected: list[str],
    concurrency: int,
    stop: asyncio.Event,
    log: AnswerLog,
    timeout_s: float = 120.0,
) -> None:
    """``concurrency`` clients send the pool round-robin until ``stop``; every answer to ``log``."""
    url = f"{base_url}/v1/chat/completions"
    turn = iter(range(1 << 62))

    async def client(http: aiohttp.ClientSession) -> None:
        while not stop.is_set():
            i = next(turn) % len(pool)
            started = time.monotonic()
            error, text = await _one(http, url, pool[i].body)
            spliced = not error and text != expected[i]
            log.answers.append(Answer(i, started, time.monotonic(), error, text if spliced else "", spliced))
            if error:
                await asyncio.sleep(0.2)  # a failing cluster is not hammered in a tight loop

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as http:
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
