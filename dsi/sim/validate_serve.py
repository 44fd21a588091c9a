"""The measured side of ``dsi sim validate``: the slice replayed open loop against a private
``dsi serve``.

The cluster is the config's layout (dsi's ``configs/local.toml`` by default) on free 127.0.0.1
ports with its store in a private directory (:func:`dsi.bench.soak_cluster.private_config`).
Before the replay one
request per engine instance (prompts that share nothing with the slice) warms every process, so
no figure holds a first request's one-off costs. Then each request of the slice is posted at its
arrival time (seconds from the replay's start), whatever the others are doing.

Then ``probes`` prompts, short (24 words) and long (the slice's longest) in turn, go one at a
time to the idle cluster: their TTFT less what the cost model gives their forward and handoff is
what the path adds (gateway, balancer, decode reservation, prefill call, store, data plane,
first chunk back), a constant and a part that grows with the prompt, which the cpu profile's
``dsi bench engine`` figures do not hold (see dsi.sim.validate.request_path).

Per request (:class:`Measured`), at the client: TTFT = the first SSE chunk that carries a token
(content or reasoning) minus the moment the request was posted, seconds; TBT = from that chunk
to the last one that carries a token, over the completion tokens less one (a chunk may carry
several tokens, so this is the mean gap per token, as the simulator's TBT is); the usage chunk's
``prompt_tokens`` and ``prompt_tokens_details.cached_tokens`` (the prefix hit the prefill took);
``late_s``, how far behind its arrival time the client posted it (a busy machine delays the
client too).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from dsi.bench.peers_served_client import sse_data
from dsi.bench.soak_cluster import ServedCluster, private_config
from dsi.sim.validate_slice import ServedRequest, chat_body

WARM_WORDS = ("harbor", "cedar", "orbit", "falcon", "ember", "quartz")


@dataclass(slots=True, frozen=True)
class Measured:
    """One request at the client. Seconds, tokens; ``ttft_s`` None and ``error`` set on failure."""

    ttft_s: float | None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    late_s: float = 0.0
    error: str | None = None
    tbt_s: float | None = None  # (last token - first) / (tokens - 1); None for one token


@dataclass(slots=True, frozen=True)
class Layout:
    """The served cluster's engine instances, as the simulator builds them."""

    prefills: int
    decodes: int
    model: str


def layout_of(cluster: ServedCluster) -> Layout:
    cfg = cluster.cfg
    return Layout(len(cfg.roles_of("prefill")), len(cfg.roles_of("decode")), cfg.model.name)


async def post(session: aiohttp.ClientSession, url: str, body: dict, late_s: float = 0.0) -> Measured:
    """Post ``body`` and read its stream to ``[DONE]``."""
    start = time.perf_counter()
    ttft, last, usage = None, 0.0, None
    try:
        async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
            if resp.status != 200:
                return Measured(None, late_s=late_s, error=f"HTTP {resp.status}: {(await resp.text())[:200]}")
            async for line in resp.content:
                data = sse_data(line)
                if data == "[DONE]":
                    break
                if not isinstance(data, dict):
                    continue
                if data.get("error"):
                    return Measured(None, late_s=late_s, error=str(data["error"])[:200])
                usage = data.get("usage") or usage
                deltas = [c.get("delta") or {} for c in data.get("choices") or []]
                if any(d.get("content") or d.get("reasoning_content") for d in deltas):
                    last = time.perf_counter() - start
                    ttft = last if ttft is None else ttft
    except (TimeoutError, aiohttp.ClientError) as exc:
        return Measured(None, late_s=late_s, error=f"{type(exc).__name__}: {exc}")
    if ttft is None or usage is None:
        return Measured(None, late_s=late_s, error="the stream ended without a token or usage")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    tokens = int(usage.get("completion_tokens") or 0)
    tbt = (last - ttft) / (tokens - 1) if tokens > 1 else None
    return Measured(ttft, int(usage["prompt_tokens"]), int(cached or 0), late_s, tbt_s=tbt)


async def replay(url: str, requests: list[ServedRequest], timeout_s: float = 600.0) -> list[Measured]:
    """Every request posted at its ``arrival_s`` (open loop); results in request order."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s)
    ) as session:
        start = time.perf_counter()

        async def one(req: ServedRequest) -> Measured:
            await asyncio.sleep(max(0.0, req.arrival_s - (time.perf_counter() - start)))
            return await post(session, url, req.body, time.perf_counter() - start - req.arrival_s)

        return list(await asyncio.gather(*(one(r) for r in requests)))


def probe_text(i: int, words: int) -> str:
    """A prompt of ``words`` one-token words that shares no page with the slice or another probe
    (its first word is the probe's number)."""
    return f"{i} " + " ".join(WARM_WORDS[(i + j) % len(WARM_WORDS)] for j in range(words))


async def sequential(url: str, model: str, texts: list[str], max_tokens: int) -> list[Measured]:
    """One request after another, each ``max_tokens`` long."""
    out = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300.0)) as session:
        for text in texts:
            out.append(await post(session, url, chat_body(model, text, max_tokens)))
    return out


@dataclass(slots=True, frozen=True)
class ServedRun:
    """What one served replay measured: the layout, the probes (short and long prompts sent one
    at a time to the idle, warm cluster) and the slice's requests."""

    layout: Layout
    probes: list[Measured]
    results: list[Measured]


def measure(
    requests: list[ServedRequest],
    config: Path,
    probes: int = 6,
    ready_timeout_s: float = 180.0,
) -> ServedRun:
    """Start a private ``dsi serve`` of ``config``; warm it (two long prompts per engine
    instance), send ``probes`` short and long prompts one at a time, replay ``requests``; stop
    it."""
    with tempfile.TemporaryDirectory(prefix="dsi-sim-validate-") as tmp:
        cluster = ServedCluster(private_config(config, Path(tmp)), Path(tmp))
        layout = layout_of(cluster)
        try:
            cluster.start(ready_timeout_s)
            url = cluster.gateway
            longest = max(r.sim.prompt_tokens for r in requests)
            max_tokens = max(r.sim.output_tokens for r in requests)
            warm = [probe_text(1000 + i, longest) for i in range(2 * (layout.prefills + layout.decodes))]
            warmed = asyncio.run(sequential(url, layout.model, warm, max_tokens))
            texts = [probe_text(i, longest if i % 2 else 24) for i in range(probes)]
            probed = asyncio.run(sequential(url, layout.model, texts, 1))
            failed = [m.error for m in warmed + probed if m.error]
            if failed:
                raise RuntimeError(f"warm-up failed: {failed[0]}")
            return ServedRun(layout, probed, asyncio.run(replay(url, requests)))
        except RuntimeError as exc:
            tail = cluster.log_path.read_text(errors="replace")[-2000:] if cluster.log_path.exists() else ""
            raise RuntimeError(f"{exc}\n--- serve.log (tail) ---\n{tail}") from None
        finally:
            cluster.stop()
