"""How ``dsi bench vllm-cluster`` drives one side: start it, warm it, replay, stop it.

A side (:class:`Side`: dsi serve, vLLM servers, or vLLM servers behind a router) is started and
then gets one short request per instance (``warm_urls``, all at once), so that no figure holds
a first request's one-off costs. Each batch is then replayed closed loop: ``concurrency``
workers take the requests in order, one stream each at a time. The side's prompt counters are
read before and after each batch (after a one-second pause: vLLM publishes a step's stats once
the step's outputs are out). :func:`measure` stops the side in a finally block, whatever happened.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Protocol

import aiohttp

from dsi.bench.peers_served_client import ServedRun, chat_body, stream_one
from dsi.bench.vllm_cluster_summary import (
    PromptCounters,
    SideFigures,
    deltas,
    figures_dict,
    merged,
    side_figures,
)
from dsi.bench.vllm_cluster_trace import BenchRequest


class Side(Protocol):
    """What :func:`measure` needs of a system under test."""

    @property
    def url(self) -> str: ...

    @property
    def warm_urls(self) -> list[str]: ...

    def start(self, timeout_s: float) -> None: ...

    async def counters(self) -> list[PromptCounters]:
        """Each instance's prompt counters since start."""
        ...

    def stop(self) -> None: ...


@dataclass(slots=True)
class Measured:
    """One side: its figures, or why there are none; ``started``: it came up."""

    figures: SideFigures | None = None
    startup_s: float | None = None
    started: bool = False
    error: str | None = None


async def replay(url: str, bodies: list[dict], concurrency: int, timeout_s: float = 900.0) -> ServedRun:
    """``bodies`` in order, at most ``concurrency`` streams at once (closed loop)."""
    results: list = [None] * len(bodies)
    pending = iter(enumerate(bodies))
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s)
    ) as session:

        async def worker() -> None:
            for i, body in pending:  # one iterator shared by the workers: trace order
                results[i] = await stream_one(session, url, body)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return ServedRun(wall, results)


def bodies(requests: list[BenchRequest], model: str) -> list[dict]:
    return [chat_body(model, r.text, r.max_tokens, {"ignore_eos": True}) for r in requests]


async def _warm(side: Side, model: str, rounds: int = 8, settle_s: float = 0.5) -> None:
    """Short requests to ``side.warm_urls``, all at once, round after round until every instance
    has computed a prompt (its counters say so): an instance's first forward pays one-time costs,
    and a gateway's balancer may send a round's requests to the same instance. RuntimeError when
    a round fails, or when an instance is still cold after ``rounds``."""
    for _ in range(rounds):
        run = await replay_each(side.warm_urls, model)
        if run.errors:
            raise RuntimeError(f"warm-up failed: {run.errors[0]}")
        await asyncio.sleep(settle_s)  # the last step's stats reach the counters
        if all(c.total > 0 for c in await side.counters()):
            return
    raise RuntimeError(f"an instance computed no warm-up prompt in {rounds} rounds")


async def replay_each(urls: list[str], model: str) -> ServedRun:
    """One short request to each of ``urls``, all at once."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=600)
    ) as session:
        start = time.perf_counter()
        warm = [chat_body(model, f"Say hello number {i}.", 4, {}) for i in range(len(urls))]
        streams = await asyncio.gather(*(stream_one(session, u, b) for u, b in zip(urls, warm, strict=True)))
        return ServedRun(time.perf_counter() - start, list(streams))


async def _drive(
    side: Side, batch: list[dict], concurrency: int, settle_s: float
) -> tuple[ServedRun, list[PromptCounters]]:
    before = await side.counters()
    run = await replay(side.url, batch, concurrency)
    await asyncio.sleep(settle_s)  # the last engine step's stats reach the counters
    return run, deltas(await side.counters(), before)


def measure(
    side: Side,
    batches: list[list[dict]],
    concurrency: int,
    model: str,
    timeout_s: float,
    settle_s: float = 1.0,
) -> Measured:
    """Start ``side`` (``timeout_s`` to come up), warm it, replay each batch (reading the counters
    ``settle_s`` after each warm-up round and after each batch's last stream), stop it (always)."""
    out = Measured()
    start = time.monotonic()
    try:
        side.start(timeout_s)
        out.started, out.startup_s = True, round(time.monotonic() - start, 1)
        asyncio.run(_warm(side, model, settle_s=settle_s))
        runs, total = [], None
        for batch in batches:
            run, delta = asyncio.run(_drive(side, batch, concurrency, settle_s))
            runs.append(run)
            total = delta if total is None else [a + b for a, b in zip(total, delta, strict=True)]
        out.figures = side_figures(merged(runs), total)
    except Exception as exc:  # reported beside the other side's figures
        out.error = f"{type(exc).__name__}: {exc}"
    finally:
        side.stop()
    return out


def side_dict(how: dict, measured: Measured) -> dict:
    return {
        **how,
        "startup_s": measured.startup_s,
        "figures": figures_dict(measured.figures),
        "error": measured.error,
    }
