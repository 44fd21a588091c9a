"""The load of ``dsi bench peers-served``: concurrent streaming Chat Completions over aiohttp.

Every stream posts one chat question with ``stream: true`` and ``stream_options.include_usage``
and reads the server-sent events to ``[DONE]``. Per stream: time to the first content delta
(TTFT, s) and its completion tokens (the usage chunk's ``completion_tokens``; the number of
content deltas when a server sends no usage). A run's output tokens/s is the sum of all
streams' completion tokens over the wall time from the first request to the last ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass

import aiohttp


@dataclass(slots=True, frozen=True)
class StreamStat:
    """One stream: ``ttft_s`` (s, None when no content came), ``tokens`` (completion tokens),
    ``error`` (why it failed, else None), ``prompt_tokens`` (the usage chunk's, 0 without one)."""

    ttft_s: float | None
    tokens: int
    error: str | None = None
    prompt_tokens: int = 0


@dataclass(slots=True, frozen=True)
class ServedRun:
    """All streams of one run and its wall time (s)."""

    wall_s: float
    streams: list[StreamStat]

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.streams)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def errors(self) -> list[str]:
        return [s.error for s in self.streams if s.error]


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of `values`; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def sse_data(line: bytes) -> dict | str | None:
    """One SSE line -> its JSON payload, ``"[DONE]"``, or None (blank, comment, not data)."""
    text = line.decode(errors="replace").strip()
    if not text.startswith("data:"):
        return None
    body = text[5:].strip()
    if body == "[DONE]":
        return body
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def chat_body(model: str, question: str, max_tokens: int, extra: dict) -> dict:
    """The request: one user turn, greedy, streamed with usage, plus `extra` (e.g. ignore_eos)."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }


async def stream_one(session: aiohttp.ClientSession, url: str, body: dict) -> StreamStat:
    """Post `body` to ``url``/v1/chat/completions and read the stream to its end."""
    start = time.perf_counter()
    ttft, deltas, usage, prompt = None, 0, None, 0
    try:
        async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
            if resp.status != 200:
                return StreamStat(None, 0, f"HTTP {resp.status}: {(await resp.text())[:300]}")
            async for line in resp.content:
                data = sse_data(line)
                if data == "[DONE]":
                    break
                if not isinstance(data, dict):
                    continue
                if data.get("usage"):
                    usage = data["usage"].get("completion_tokens")
                    prompt = int(data["usage"].get("prompt_tokens") or 0)
                for choice in data.get("choices") or []:
                    if (choice.get("delta") or {}).get("content"):
                        deltas += 1
                        if ttft is None:
                            ttft = time.perf_counter() - start
    except (TimeoutError, aiohttp.ClientError) as exc:
        return StreamStat(ttft, deltas, f"{type(exc).__name__}: {exc}", prompt)
    return StreamStat(ttft, int(usage) if usage is not None else deltas, None, prompt)


async def drive(url: str, bodies: list[dict], timeout_s: float = 900.0) -> ServedRun:
    """All `bodies` at once, one stream each; the run's wall time and every stream."""
    limits = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=limits, timeout=timeout) as session:
        start = time.perf_counter()
        streams = await asyncio.gather(*(stream_one(session, url, b) for b in bodies))
        wall = time.perf_counter() - start
    return ServedRun(wall, list(streams))


async def wait_ready(url: str, timeout_s: float, alive) -> bool:
    """Poll ``url``/v1/models until it answers 200 (True), `alive()` turns False or time runs out."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        while time.monotonic() < deadline and alive():
            try:
                async with session.get(f"{url}/v1/models") as resp:
                    if resp.status == 200:
                        return True
            except (TimeoutError, aiohttp.ClientError):
                pass
            await asyncio.sleep(1.0)
    return False
