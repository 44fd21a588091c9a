"""Many chat completions at once against a gateway, with an action once they are under way.

``run_streams`` posts every body concurrently and reads each SSE stream to its end; ``when``
decides from the streams' progress when ``action`` runs (once). A stream's result is what the
client saw: the content, the reasoning, the finish reasons and the error event, if any.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiohttp


@dataclass(slots=True)
class Seen:
    """One stream as the client saw it. ``opened``: the 200 arrived; ``deltas``: content or
    reasoning deltas so far."""

    opened: bool = False
    deltas: int = 0
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    finish: list[str] = field(default_factory=list)
    error: str | None = None
    done: bool = False  # the [DONE] line came
    status: int = 0
    body: str = ""  # a refused request's JSON body
    cached_tokens: int | None = None  # from the usage chunk (prompt tokens the engine reused)
    ended_at: float = 0.0  # time.monotonic() when the response ended (0.0: it has not)

    @property
    def outcome(self) -> tuple[str, str, list[str]]:
        return "".join(self.content), "".join(self.reasoning), self.finish


def chat_body(
    text: str,
    max_tokens: int,
    *,
    temperature: float = 0.0,
    seed: int | None = None,
    hit_policy: str | None = None,
) -> dict:
    body: dict = {
        "model": "dsi-tiny",
        "stream": True,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": text}],
        "thinking": {"type": "disabled"},
    }  # thinking mode would sample at temperature 1.0
    if seed is not None:
        body["seed"] = seed
    if hit_policy is not None:
        body["metadata"] = {"hit_policy": hit_policy}
    return body


async def _one(
    http: aiohttp.ClientSession, url: str, body: dict, seen: Seen, progress: asyncio.Event
) -> None:
    try:
        async with http.post(url, json=body) as resp:
            seen.status = resp.status
            if resp.status != 200:
                seen.body = await resp.text()
                progress.set()
                return
            seen.opened = True
            progress.set()
            async for raw in resp.content:
                line = raw.decode().strip()
                if line == "data: [DONE]":
                    seen.done = True
                elif line.startswith("data: {"):
                    _event(json.loads(line[6:]), seen)
                    progress.set()
    finally:
        seen.ended_at = time.monotonic()


def _event(event: dict, seen: Seen) -> None:
    if "error" in event:
        seen.error = json.dumps(event["error"])
    if event.get("usage"):
        seen.cached_tokens = event["usage"]["prompt_tokens_details"]["cached_tokens"]
    for choice in event.get("choices", []):
        delta = choice.get("delta", {})
        if delta.get("content") or delta.get("reasoning_content"):
            seen.deltas += 1
        seen.content.append(delta.get("content") or "")
        seen.reasoning.append(delta.get("reasoning_content") or "")
        if choice.get("finish_reason"):
            seen.finish.append(choice["finish_reason"])


async def _streams(
    url: str,
    bodies: Sequence[dict],
    when: Callable[[list[Seen]], bool] | None,
    action: Callable[[], None] | None,
    timeout_s: float,
) -> tuple[list[Seen], bool]:
    seen = [Seen() for _ in bodies]
    progress = asyncio.Event()
    acted = False
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as http:
        tasks = [
            asyncio.create_task(_one(http, url, body, s, progress))
            for body, s in zip(bodies, seen, strict=True)
        ]
        while not all(t.done() for t in tasks):
            if action is not None and not acted and when is not None and when(seen):
                action()
                acted = True
            progress.clear()
            waiting = [asyncio.create_task(progress.wait())]
            await asyncio.wait([*tasks, *waiting], return_when=asyncio.FIRST_COMPLETED)
            waiting[0].cancel()
        for task in tasks:
            task.result()  # a transport failure is the test's failure
    return seen, acted


def run_streams(
    port: int,
    bodies: Sequence[dict],
    when: Callable[[list[Seen]], bool] | None = None,
    action: Callable[[], None] | None = None,
    timeout_s: float = 120.0,
) -> tuple[list[Seen], bool]:
    """Every body as a streamed chat completion on the gateway at 127.0.0.1:`port`; `action` runs
    once, as soon as `when(progress)` holds. The streams, and whether the action ran."""
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    return asyncio.run(_streams(url, bodies, when, action, timeout_s))
