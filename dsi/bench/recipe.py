"""``dsi bench recipe``: what the recipe and the gateway cost, each beside a reference measured
in the same run.

    encode   dsi.recipe.bench_encode: Recipe.prepare("chat", body), one user message of 1 MB and
             4 MB (English, Chinese) vs deepseek-recipe's ChatCompletionRequest.convert +
             DeepseekV4Encoding.encode
             encode_4mb_ratio_vs_recipe = their time / ours at the largest size (target >= 1.5)
    parse    dsi.recipe.bench_parse: OutputParser vs deepseek-recipe's StreamProcessor, µs per token
    gateway  wall time per streamed token, 256 concurrent Chat Completions streams:
             the real gateway app (recipe, OutputStream, metrics, SSE) vs a bare aiohttp server
             that writes one minimal ``data: {...}`` line per chunk; both fed by TokenSource
             gateway_overhead_ratio = gateway / bare

Each server runs in its own spawned child process on uvloop; the clients run in this process,
so client CPU does not share the server's event loop. Gateway and bare rounds alternate.
Encode and gateway figures are medians over repeats; parse figures are bench_parse's best of
repeats. On a small machine the single client process can be
the bottleneck of the wall time; ``*_server_cpu_us_per_token`` (the serving process's user +
system CPU time per token, over all measured rounds) does not depend on how fast it reads.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import re
import statistics
import time
from collections.abc import AsyncIterator
from multiprocessing.connection import Connection

import aiohttp
import uvloop
from aiohttp import web

from dsi.bench.child import ServerProcess, serve_until_terminated
from dsi.engine.params import SamplingParams
from dsi.messages.gateway import Generate, TokenChunk
from dsi.model.config import TINY
from dsi.recipe import ModelVersion, Recipe
from dsi.recipe.bench_encode import bench_encode as encode_figures
from dsi.recipe.bench_parse import bench_parse, output_ids
from dsi.roles.entrypoint.app import make_app, start_http
from dsi.roles.entrypoint.auth import ApiKeys
from dsi.roles.entrypoint.backends import Placement
from dsi.roles.entrypoint.gateway import Gateway
from dsi.roles.entrypoint.metrics import Metrics
from dsi.roles.entrypoint.prepare import Preparer
from dsi.roles.entrypoint.sse import SSE_HEADERS

MODEL = "dsi-tiny"
_HOST = "127.0.0.1"


# ---- encode ------------------------------------------------------------------------------------
def bench_encode(sizes_mb: tuple[int, ...] = (1, 4), repeats: int = 3) -> dict[str, float | bool]:
    """dsi.recipe.bench_encode's figures (seconds, medians; ``_same_ids`` checks ours against
    deepseek-recipe's), and ``encode_4mb_ratio_vs_recipe``: their time / ours at the largest size."""
    figures = encode_figures(repeats=repeats, sizes_mb=sizes_mb)
    largest = max(sizes_mb)
    ratio = figures.get(f"encode_{largest}mb_ratio_vs_recipe")
    if ratio is None:
        raise RuntimeError("the encode comparison needs deepseek-recipe (a dev dependency) installed")
    out = {k: v for k, v in figures.items() if k.startswith("encode_")}
    out |= {
        "encode_repeats": figures["repeats"],
        "encode_chunked": figures["chunked"],
        "encode_largest_mb": largest,
    }
    return out | {"encode_4mb_ratio_vs_recipe": round(ratio, 3)}


# ---- gateway: token source and the two servers (child processes) --------------------------------
class TokenSource:
    """Stands in for DecodePool (``generate``, ``pick``, ``ready``, ``metric_lines``): every request gets ``ids``,
    one id per chunk as one engine step would send it, ``interval_s`` apart (0: one turn of the
    event loop, as a chunk arriving on a socket gives)."""

    def __init__(self, ids: list[int], interval_s: float = 0.0) -> None:
        self.ids = ids
        self.interval_s = interval_s

    @property
    def ready(self) -> list[str]:
        return ["bench"]

    def metric_lines(self) -> list[str]:
        return []  # no instances, no transitions

    def pick(self, exclude: frozenset[str] = frozenset()) -> str:
        return "bench"

    async def generate(self, msg: Generate, placement: Placement | None = None) -> AsyncIterator[TokenChunk]:
        if placement is not None:
            placement.decode = "bench"
        last = len(self.ids) - 1
        for i, token in enumerate(self.ids):
            await asyncio.sleep(self.interval_s)
            yield TokenChunk(
                msg.request_id, [token], finish="stop" if i == last else "", prompt_tokens=len(msg.token_ids)
            )


def stream_ids(tokens: int) -> list[int]:
    """``tokens`` ordinary text ids: English, Chinese and emoji, as a model writes them."""
    unit = output_ids(["Here is the forecast: sunny in Paris, 东京有小雨 🌧️, and a mild evening. "])
    return (unit * (tokens // len(unit) + 1))[:tokens]


def _serve_gateway_main(conn: Connection, ids: list[int], interval_s: float, streams: int) -> None:
    uvloop.run(_serve_gateway(conn, ids, interval_s, streams))


async def _serve_gateway(conn: Connection, ids: list[int], interval_s: float, streams: int) -> None:
    preparer = Preparer(Recipe({MODEL: ModelVersion.V4}), TINY.max_context)
    gateway = Gateway(TokenSource(ids, interval_s), ApiKeys.load(None, streams), Metrics(), preparer)
    runner = await start_http(make_app(gateway, [MODEL], 1 << 20), _HOST, 0)
    await serve_until_terminated(conn, runner.addresses[0][1])


def _serve_bare_main(conn: Connection, ids: list[int], interval_s: float, _streams: int) -> None:
    uvloop.run(_serve_bare(conn, ids, interval_s))


async def _serve_bare(conn: Connection, ids: list[int], interval_s: float) -> None:
    source = TokenSource(ids, interval_s)
    served = 0

    async def chat(request: web.Request) -> web.StreamResponse:
        nonlocal served
        body = json.loads(await request.read())
        served += 1
        msg = Generate(f"bare-{served}", [], SamplingParams(max_tokens=body.get("max_tokens", 256)))
        resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
        await resp.prepare(request)
        async for chunk in source.generate(msg):
            line = json.dumps({"id": msg.request_id, "token_ids": chunk.token_ids})
            await resp.write(f"data: {line}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = await start_http(app, _HOST, 0)
    await serve_until_terminated(conn, runner.addresses[0][1])


# ---- gateway: clients (this process) ------------------------------------------------------------
async def _one_stream(session: aiohttp.ClientSession, url: str, body: str) -> None:
    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}: {await resp.text()}")
        tail = b""
        async for data in resp.content.iter_any():
            tail = (tail + data)[-32:]
    if not tail.rstrip().endswith(b"data: [DONE]"):
        raise RuntimeError(f"{url}: the stream ended before data: [DONE]")


async def _round(session: aiohttp.ClientSession, url: str, body: str, streams: int) -> float:
    """Seconds until ``streams`` concurrent streams have all been read to the end."""
    t0 = time.perf_counter()
    await asyncio.gather(*(_one_stream(session, url, body) for _ in range(streams)))
    return time.perf_counter() - t0


async def _drive(
    servers: dict[str, ServerProcess], streams: int, tokens: int, repeats: int
) -> dict[str, float]:
    messages = [{"role": "user", "content": "Tell me about the weather."}]
    body = json.dumps({"model": MODEL, "messages": messages, "stream": True, "max_tokens": tokens,
                       "thinking": {"type": "disabled"}})  # fmt: skip
    timeout = aiohttp.ClientTimeout(total=None, sock_read=120)
    sessions = {
        name: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout)
        for name in servers
    }
    urls = {name: f"http://{_HOST}:{s.port}/v1/chat/completions" for name, s in servers.items()}
    walls: dict[str, list[float]] = {name: [] for name in servers}
    cpu = dict.fromkeys(servers, 0.0)
    try:
        for name in servers:  # warm up: connections open, first-call costs paid
            await _round(sessions[name], urls[name], body, streams)
        for _ in range(repeats):
            for name, server in servers.items():
                before = server.cpu_s()
                walls[name].append(await _round(sessions[name], urls[name], body, streams))
                cpu[name] += server.cpu_s() - before
    finally:
        for session in sessions.values():
            await session.close()
    n = streams * tokens
    out: dict[str, float] = {}
    for name in servers:
        out[f"{name}_us_per_token"] = round(statistics.median(walls[name]) / n * 1e6, 3)
        out[f"{name}_server_cpu_us_per_token"] = round(cpu[name] / (repeats * n) * 1e6, 3)
    return out


def bench_gateway(
    streams: int = 256, tokens: int = 128, repeats: int = 5, interval_s: float = 0.0
) -> dict[str, float]:
    """Wall time per streamed token through the gateway and through a bare aiohttp SSE server,
    ``streams`` concurrent Chat Completions streams of ``tokens`` one-token chunks each."""
    if streams < 1 or tokens < 1 or repeats < 1 or interval_s < 0:
        raise ValueError("streams, tokens and repeats must be positive, interval_s >= 0")
    ids = stream_ids(tokens)
    servers: dict[str, ServerProcess] = {}
    try:
        servers["gateway"] = ServerProcess(_serve_gateway_main, ids, interval_s, streams)
        servers["bare"] = ServerProcess(_serve_bare_main, ids, interval_s, streams)
        out = uvloop.run(_drive(servers, streams, tokens, repeats))
    finally:
        for server in servers.values():
            server.stop()
    out["gateway_overhead_ratio"] = round(out["gateway_us_per_token"] / out["bare_us_per_token"], 3)
    out["gateway_cpu_ratio"] = round(
        out["gateway_server_cpu_us_per_token"] / out["bare_server_cpu_us_per_token"], 3
    )
    return out | {"streams": streams, "stream_tokens": tokens, "gateway_repeats": repeats}


# ---- all together ------------------------------------------------------------------------------
def run(encode_sizes_mb: tuple[int, ...] = (1, 4), encode_repeats: int = 3, parse_tokens: int = 4096,
        parse_repeats: int = 9, streams: int = 256, tokens: int = 128, gateway_repeats: int = 5,
        interval_s: float = 0.0) -> dict[str, float]:  # fmt: skip
    """Every figure of the benchmark in one flat dict: encode times in seconds, the rest in µs per token."""
    out = bench_encode(encode_sizes_mb, encode_repeats)
    parse = bench_parse(min_tokens=parse_tokens, repeats=parse_repeats)
    out |= {("parse_tokens" if k == "tokens" else k): v for k, v in parse.items()}
    return out | bench_gateway(streams, tokens, gateway_repeats, interval_s)


def format_table(r: dict) -> str:
    """One row per figure: dsi, the reference measured beside it, and their ratio."""
    sizes = sorted({int(m[1]) for k in r if (m := re.fullmatch(r"encode_(\d+)mb_en_s", k))})
    lines = [
        "dsi bench recipe (encode, gateway: medians; parse: best of repeats)",
        f"{'':36}{'dsi':>12}{'reference':>12}   ratio",
    ]
    for mb, lang in itertools.product(sizes, ("en", "zh")):
        key = f"encode_{mb}mb_{lang}"
        ours, ref = r[f"{key}_s"] * 1e3, r[f"{key}_recipe_s"] * 1e3
        same = "" if r[f"{key}_same_ids"] else "  (ids differ!)"
        name = f"encode {lang} {mb} MB ms ({r[f'{key}_tokens']:,} tok)"
        lines.append(f"{name:36}{ours:>12,.1f}{ref:>12,.1f}   {ref / ours:.2f}{same}")
    rows = [
        ("parse us/token (ids -> events)", "parse_us_per_token", "recipe_us_per_token", "parse_ratio_vs_recipe"),
        ("stream us/token (ids -> SSE)", "stream_us_per_token", "recipe_stream_us_per_token", "stream_ratio_vs_recipe"),
        ("", "gateway", "bare", ""),
        (f"wall us/token, {r['streams']} streams", "gateway_us_per_token", "bare_us_per_token", "gateway_overhead_ratio"),
        ("server CPU us/token", "gateway_server_cpu_us_per_token", "bare_server_cpu_us_per_token", "gateway_cpu_ratio"),
    ]  # fmt: skip
    for name, ours, ref, ratio in rows:
        if ours in r:
            lines.append(f"{name:36}{r[ours]:>12,.3f}{r[ref]:>12,.3f}   {r[ratio]:.2f}")
        else:
            lines.append(f"{name:36}{ours:>12}{ref:>12}")
    lines.append(f"encode_4mb_ratio_vs_recipe ({r['encode_largest_mb']} MB) {r['encode_4mb_ratio_vs_recipe']:.2f} "
                 f"(target >= 1.5); gateway_overhead_ratio {r['gateway_overhead_ratio']:.2f}")  # fmt: skip
    return "\n".join(lines)


def _sizes(text: str) -> tuple[int, ...]:
    return tuple(int(s) for s in text.split(","))


def _main(args: argparse.Namespace) -> int:
    result = run(args.encode_mb, args.encode_repeats, args.parse_tokens, args.parse_repeats, args.streams,
                 args.tokens, args.gateway_repeats, args.interval_ms / 1e3)  # fmt: skip
    print(json.dumps(result) if args.json else format_table(result))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "recipe", help="encode, stream parse and gateway cost beside deepseek-recipe / bare aiohttp"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument(
        "--encode-mb", type=_sizes, default=(1, 4), help="user message sizes in MB (default 1,4)"
    )
    parser.add_argument("--encode-repeats", type=int, default=3)
    parser.add_argument("--parse-tokens", type=int, default=4096, help="length of the parsed output (tokens)")
    parser.add_argument("--parse-repeats", type=int, default=9)
    parser.add_argument("--streams", type=int, default=256, help="concurrent streams against each server")
    parser.add_argument("--tokens", type=int, default=128, help="tokens per stream, one per chunk")
    parser.add_argument("--gateway-repeats", type=int, default=5)
    parser.add_argument("--interval-ms", type=float, default=0.0, help="gap between a stream's chunks (ms)")
    parser.set_defaults(func=_main)
