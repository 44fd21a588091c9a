"""``dsi bench route``: requests/s and latency through the gateway and its routing, engines
replaced by instant echoes, beside vllm-router and sglang-router in the same run.

    route          client --HTTP--> entrypoint (real EntrypointActor in its own process: auth,
                   recipe encode, output recipe, SSE) --RouteQuery--> balancer (real
                   BalancerActor in its own process) --Route--> entrypoint --ZeroMQ stream-->
                   ``workers`` EchoDecodeActor instances (dsi.bench.echo_engine), registered
                   with a real controller and pushing LoadReports to the balancer
                   (``route_mode = "table"``: it routes from the balancer's decision table and
                   asks only while it holds no fresh one; see dsi.roles.entrypoint.router)
    route_query    the same, through a third entrypoint of ``route_mode = "ask"``: a RouteQuery
                   per request
    route_local    the same, through an entrypoint whose config lists no balancer: it
                   picks the decode itself (DecodePool's least loaded); same echoes, same controller
    vllm_router    client --HTTP--> vllm-router --HTTP--> ``workers`` EchoBackend servers
    sglang_router  client --HTTP--> sglang-router --HTTP--> the same EchoBackend servers
                   (dsi.bench.echo_http; both routers with ``--policy round_robin``)

Every request is a streamed Chat Completion of ``tokens`` one-token chunks; ``concurrency``
clients each send the next request when the last one ended, ``requests`` per round. Rounds
alternate between the systems; ``*_req_s`` is the median round's requests per second,
``*_p50_ms`` / ``*_p99_ms`` are over every measured request, ``*_cpu_us_per_req`` is the
front process's (entrypoint's / router's) CPU time per request over all rounds; both
entrypoints run ``http_workers`` HTTP worker processes (``--http-workers``, default half the
CPUs, 2 to 4), whose CPU time counts in the entrypoint's (their /metrics is one sum, gathered
by the worker a scrape reaches);
``route_balancer_cpu_us_per_req`` is the balancer process's over the route rounds.
``route_vs_*`` = route_req_s / the other's. From the balanced entrypoint's /metrics, over the
measured rounds: ``route_balancer_fraction`` (decode routes with source table or balancer / all),
``route_table_fraction`` (source table / all),
``route_fallbacks`` (local picks by reason) and ``route_ask_mean_us`` (``dsi_route_seconds``'
mean). Before measuring, the balanced entrypoint must have routed a request through the
balancer. It waits up to ``balancer_timeout_ms`` (default 1000) for each route: with a
deployment's default of 20 ms, asks on a loaded machine miss the bound, the gateway skips the
balancer for a second and routes locally, and ``route`` would measure a mix of both paths. The routers are installed into a venv of their own (``--peers-dir``, default
run/route-peers); one that cannot be installed or started gets null figures and ``*_error``
says why. The client runs in this process: on a small machine it can bound every system's
requests/s alike, and the CPU figures do not depend on it.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import re
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

import aiohttp
import uvloop

from dsi.bench.child import ServerProcess, process_cpu_s, serve_until_terminated, tree_cpu_s
from dsi.bench.echo_engine import serve_echo_roles
from dsi.bench.echo_http import serve_echo_http
from dsi.bench.recipe import stream_ids
from dsi.bench.route_peers import PEERS, free_port, install_peers, start_router, stop_router
from dsi.config import parse_config
from dsi.roles.host import RoleHost
from dsi.tokenizer import decode_ids

MODEL = "dsi-tiny"
_HOST = "127.0.0.1"
_START_WAIT_S = 60.0
_BALANCER_TIMEOUT_S = 1.0
_DEFAULT_PEERS_DIR = Path("run/route-peers")


# ---- dsi: controller + echo decodes, the balancer and two entrypoints, in child processes --------
def cluster_config(
    workers: int, balancer_timeout_s: float = _BALANCER_TIMEOUT_S, http_workers: int = 1
) -> dict:
    """A node config (as parsed TOML) of one controller, one balancer, three entrypoints of
    ``http_workers`` HTTP worker processes each, and ``workers`` decodes. ``entrypoint-0`` routes
    from the balancer's tables, ``entrypoint-2`` asks it per request; ``entrypoint-1`` is started
    from :func:`without_balancer` of it and picks locally. ``balancer_timeout_s``: how long ``entrypoint-0`` waits for the balancer's route
    before it picks locally."""
    controller = f"tcp://{_HOST}:{free_port()}"
    roles = [{"kind": "controller", "id": "controller-0", "bind": controller},
             {"kind": "balancer", "id": "balancer-0", "bind": f"tcp://{_HOST}:{free_port()}"}]  # fmt: skip
    roles += [
        {"kind": "entrypoint", "id": f"entrypoint-{i}", "bind": f"tcp://{_HOST}:{free_port()}",
         "http": f"{_HOST}:{free_port()}", "balancer_timeout_s": balancer_timeout_s,
         "http_workers": http_workers, "route_mode": "ask" if i == 2 else "table"}
        for i in range(3)
    ]  # fmt: skip
    roles += [
        {"kind": "decode", "id": f"decode-{i}", "bind": f"tcp://{_HOST}:{free_port()}"}
        for i in range(workers)
    ]
    return {
        "cluster": {"name": "bench-route", "controller": controller, "heartbeat_interval_s": 0.5},
        "logging": {"level": "warning"},
        "model": {"name": MODEL, "config": "tiny"},
        "roles": roles,
    }


def without_balancer(data: dict) -> dict:
    """``data`` with no balancer role: an entrypoint started from it routes by itself."""
    return data | {"roles": [r for r in data["roles"] if r["kind"] != "balancer"]}


def _serve_echoes_main(conn: Connection, data: dict, ids: list[int]) -> None:
    uvloop.run(_serve_echoes(conn, data, ids))


async def _serve_echoes(conn: Connection, data: dict, ids: list[int]) -> None:
    cfg = parse_config(data, "<bench route>")
    host = await serve_echo_roles(cfg, [r.id for r in cfg.roles if r.kind in ("controller", "decode")], ids)
    try:
        await serve_until_terminated(conn, 0)
    finally:
        await host.stop()


def _serve_role_main(conn: Connection, data: dict, role_id: str) -> None:
    uvloop.run(_serve_role(conn, data, role_id))


async def _serve_role(conn: Connection, data: dict, role_id: str) -> None:
    """One role of ``data`` in this process; reports the entrypoint's HTTP port (else 0)."""
    cfg = parse_config(data, "<bench route>")
    host = RoleHost(cfg, [role_id])
    await host.start()
    try:
        await serve_until_terminated(conn, getattr(cfg.role(role_id).options, "http_port", 0))
    finally:
        await host.stop()


def _serve_backends_main(conn: Connection, pieces: list[str], workers: int) -> None:
    uvloop.run(_serve_backends(conn, pieces, workers))


async def _serve_backends(conn: Connection, pieces: list[str], workers: int) -> None:
    # sglang-router first tries HTTP/2 with prior knowledge, which aiohttp answers 400 and logs
    # as an error before the router falls back to HTTP/1.1.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    runners, ports = await serve_echo_http(MODEL, pieces, workers)
    try:
        await serve_until_terminated(conn, ports)
    finally:
        for runner in runners:
            await runner.cleanup()


@dataclass(slots=True)
class Front:
    """One measured system: the URL the client posts to and its front process's CPU clock."""

    url: str
    cpu_s: Callable[[], float]  # CPU seconds of the front process so far
    balancer_cpu_s: Callable[[], float] | None = None  # the balancer's, when one routes for it
    metrics_url: str = ""  # with a balancer: the gateway's /metrics, to check where routes came from
    routes: dict[str, float] = field(default_factory=dict)  # route counters over the measured rounds


# ---- the client ---------------------------------------------------------------------------------------
async def _one(session: aiohttp.ClientSession, url: str, body: str) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}: {await resp.text()}")
        tail = b""
        async for data in resp.content.iter_any():
            tail = (tail + data)[-256:]
    if not tail.rstrip().endswith(b"data: [DONE]"):
        raise RuntimeError(f"{url}: the stream ended before data: [DONE]")
    return time.perf_counter() - t0, tail


async def _round(
    session: aiohttp.ClientSession, url: str, body: str, requests: int, concurrency: int
) -> tuple[float, list[float]]:
    """(seconds, latencies in seconds) of ``requests`` requests, ``concurrency`` at a time."""
    latencies: list[float] = []
    left = requests

    async def client() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            latencies.append((await _one(session, url, body))[0])

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return time.perf_counter() - t0, latencies


async def _wait_ready(session: aiohttp.ClientSession, name: str, url: str, body: str) -> None:
    """Until one request streams through (the front learns its workers by then)."""
    deadline = time.monotonic() + _START_WAIT_S
    while True:
        try:
            _, tail = await _one(session, url, body)
            if b'"finish_reason":"length"' not in tail.replace(b" ", b""):
                raise RuntimeError(f"{name}: the stream did not end with finish_reason length: {tail!r}")
            return
        except (aiohttp.ClientError, OSError, RuntimeError) as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not serve a request in {_START_WAIT_S}s: {exc}") from None
            await asyncio.sleep(0.2)


_ROUTE_LINE = re.compile(r'^dsi_route_total\{role="decode",source="(\w+)"\} (\S+)$', re.M)
_FALLBACK_LINE = re.compile(r'^dsi_route_fallbacks_total\{reason="(\w+)"\} (\S+)$', re.M)
_ASK_LINE = re.compile(r"^dsi_route_seconds_(sum|count) (\S+)$", re.M)


async def route_counters(url: str) -> dict[str, float]:
    """The gateway's route counters from its /metrics (the sum over its HTTP workers):
    ``source:<table|balancer|local>`` (decode routes), ``fallback:<reason>``, ``ask:sum`` /
    ``ask:count`` (dsi_route_seconds)."""
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}")
        text = await resp.text()
    out: dict[str, float] = {}
    for k, v in _ROUTE_LINE.findall(text):
        out[f"source:{k}"] = float(v)
    for k, v in _FALLBACK_LINE.findall(text):
        out[f"fallback:{k}"] = float(v)
    for k, v in _ASK_LINE.findall(text):
        out[f"ask:{k}"] = float(v)
    return out


async def _wait_balanced(session: aiohttp.ClientSession, name: str, front: Front, body: str) -> None:
    """Until a request is routed by the balancer (it knows the echoes once the controller lists
    them as serving and their first load reports arrived)."""
    deadline = time.monotonic() + _START_WAIT_S
    while True:
        before = await route_counters(front.metrics_url)
        await _one(session, front.url, body)
        after = await route_counters(front.metrics_url)
        if _balanced(after) > _balanced(before):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name}: no request was routed by the balancer in {_START_WAIT_S}s: {after}")
        await asyncio.sleep(0.2)


def _balanced(counts: dict[str, float]) -> float:
    return counts.get("source:balancer", 0.0) + counts.get("source:table", 0.0)


def _route_figures(name: str, before: dict[str, float], after: dict[str, float]) -> dict:
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    routed = _balanced(d) + d.get("source:local", 0.0)
    asks = d.get("ask:count", 0.0)
    return {
        f"{name}_balancer_fraction": round(_balanced(d) / routed, 4) if routed else None,
        f"{name}_table_fraction": round(d.get("source:table", 0.0) / routed, 4) if routed else None,
        f"{name}_fallbacks": {
            k.split(":", 1)[1]: int(v) for k, v in d.items() if k.startswith("fallback:") and v
        },
        f"{name}_ask_mean_us": round(d.get("ask:sum", 0.0) / asks * 1e6, 1) if asks else None,
    }


async def drive(fronts: dict[str, Front], requests: int, concurrency: int, tokens: int, repeats: int) -> dict:
    """Figures of every front that serves; a peer that never serves gets ``<name>_error`` instead."""
    messages = [{"role": "user", "content": "Echo this, please."}]
    body = json.dumps({"model": MODEL, "messages": messages, "stream": True, "max_tokens": tokens})
    timeout = aiohttp.ClientTimeout(total=None, sock_read=60)
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout)
    rates: dict[str, list[float]] = {name: [] for name in fronts}
    lat: dict[str, list[float]] = {name: [] for name in fronts}
    cpu = dict.fromkeys(fronts, 0.0)
    balancer_cpu = dict.fromkeys(fronts, 0.0)
    errors: dict[str, str] = {}
    out: dict = {}
    try:
        for name, front in list(fronts.items()):
            try:
                await _wait_ready(session, name, front.url, body)
            except RuntimeError as exc:
                if name.startswith("route"):
                    raise
                errors[f"{name}_error"], fronts = str(exc), {k: v for k, v in fronts.items() if k != name}
                continue
            if front.metrics_url:
                await _wait_balanced(session, name, front, body)
            await _round(session, front.url, body, requests, concurrency)  # warm up
        counted = {name: await route_counters(f.metrics_url) for name, f in fronts.items() if f.metrics_url}
        for _ in range(repeats):
            for name, front in fronts.items():
                before = front.cpu_s()
                before_balancer = front.balancer_cpu_s() if front.balancer_cpu_s else 0.0
                wall, latencies = await _round(session, front.url, body, requests, concurrency)
                cpu[name] += front.cpu_s() - before
                if front.balancer_cpu_s:
                    balancer_cpu[name] += front.balancer_cpu_s() - before_balancer
                rates[name].append(requests / wall)
                lat[name] += latencies
        for name, before_counts in counted.items():
            out |= _route_figures(name, before_counts, await route_counters(fronts[name].metrics_url))
    finally:
        await session.close()
    out |= errors
    for name in fronts:
        ordered = sorted(lat[name])
        out[f"{name}_req_s"] = round(statistics.median(rates[name]), 1)
        out[f"{name}_p50_ms"] = round(ordered[len(ordered) // 2] * 1e3, 3)
        out[f"{name}_p99_ms"] = round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3, 3)
        out[f"{name}_cpu_us_per_req"] = round(cpu[name] / (repeats * requests) * 1e6, 1)
        if fronts[name].balancer_cpu_s:
            out[f"{name}_balancer_cpu_us_per_req"] = round(balancer_cpu[name] / (repeats * requests) * 1e6, 1)
    return out


# ---- all together ---------------------------------------------------------------------------------------
def echo_pieces(ids: list[int]) -> list[str]:
    """The text of ``ids`` in ``len(ids)`` pieces of about equal length: what the HTTP echoes send,
    so that both sides stream about the same bytes."""
    text = decode_ids(ids)
    n = len(ids)
    cuts = [round(i * len(text) / n) for i in range(n + 1)]
    return [text[a:b] or " " for a, b in itertools.pairwise(cuts)]


def run(
    requests: int = 512,
    concurrency: int = 32,
    tokens: int = 16,
    repeats: int = 3,
    workers: int = 2,
    peers: tuple[str, ...] = tuple(PEERS),
    peers_dir: Path = _DEFAULT_PEERS_DIR,
    balancer_timeout_s: float = _BALANCER_TIMEOUT_S,
    http_workers: int = 1,
    ask: bool = True,
) -> dict:
    """Every figure in one flat dict (see the module docstring); a peer that could not run has
    null figures and ``<peer>_error``."""
    if min(requests, concurrency, tokens, repeats, workers, http_workers) < 1:
        raise ValueError("requests, concurrency, tokens, repeats, workers and http_workers must be positive")
    unknown = set(peers) - set(PEERS)
    if unknown:
        raise ValueError(f"unknown peers {sorted(unknown)}; known: {sorted(PEERS)}")
    ids = stream_ids(tokens)
    out: dict = {
        "requests": requests,
        "concurrency": concurrency,
        "stream_tokens": tokens,
        "repeats": repeats,
        "workers": workers,
        "http_workers": http_workers,
        "balancer_timeout_ms": round(balancer_timeout_s * 1e3, 3),
    }
    children: list[ServerProcess] = []
    routers: list[subprocess.Popen] = []
    fronts: dict[str, Front] = {}
    try:
        data = cluster_config(workers, balancer_timeout_s, http_workers)
        bin_dir, why = install_peers(peers_dir) if peers else (None, "")
        children.append(ServerProcess(_serve_echoes_main, data, ids))  # these boot side by side
        balancer = ServerProcess(_serve_role_main, data, "balancer-0")
        entry = ServerProcess(_serve_role_main, data, "entrypoint-0")
        asking = ServerProcess(_serve_role_main, data, "entrypoint-2") if ask else None
        local = ServerProcess(_serve_role_main, without_balancer(data), "entrypoint-1")
        children += [balancer, entry, local] + ([asking] if asking is not None else [])
        if bin_dir is not None:
            backends = ServerProcess(_serve_backends_main, echo_pieces(ids), workers)
            children.append(backends)
        for child in children:
            _ = child.port  # every one is listening
        # An entrypoint's CPU: its role process and its HTTP worker processes together.
        fronts["route"] = Front(
            f"http://{_HOST}:{entry.port}/v1/chat/completions",
            lambda: tree_cpu_s(entry.process.pid),
            balancer.cpu_s,
            f"http://{_HOST}:{entry.port}/metrics",
        )
        if asking is not None:
            fronts["route_query"] = Front(
                f"http://{_HOST}:{asking.port}/v1/chat/completions",
                lambda: tree_cpu_s(asking.process.pid),
                balancer.cpu_s,
                f"http://{_HOST}:{asking.port}/metrics",
            )
        fronts["route_local"] = Front(
            f"http://{_HOST}:{local.port}/v1/chat/completions", lambda: tree_cpu_s(local.process.pid)
        )
        if bin_dir is not None:
            for name in peers:
                proc, port = start_router(name, bin_dir, backends.port, peers_dir)
                routers.append(proc)
                fronts[name] = Front(
                    f"http://{_HOST}:{port}/v1/chat/completions", lambda pid=proc.pid: process_cpu_s(pid)
                )
        else:
            out |= {f"{name}_error": why for name in peers}
        out |= uvloop.run(drive(fronts, requests, concurrency, tokens, repeats))
    finally:
        for proc in routers:
            stop_router(proc)
        for child in reversed(children):
            child.stop()
    for name in ("route_query", "route_local", *peers) if ask else ("route_local", *peers):
        for figure in ("req_s", "p50_ms", "p99_ms", "cpu_us_per_req"):
            out.setdefault(f"{name}_{figure}", None)
        theirs = out[f"{name}_req_s"]
        out[f"route_vs_{name}"] = round(out["route_req_s"] / theirs, 3) if theirs else None
    return out


def format_table(r: dict) -> str:
    """One row per system: requests/s, latencies, front CPU, and route's ratio to it; then where
    the balanced entrypoint's routes came from."""
    lines = [f"dsi bench route: {r['concurrency']} concurrent streams of {r['stream_tokens']} tokens, "
             f"{r['workers']} echo workers, {r.get('http_workers', 1)} HTTP workers per entrypoint, "
             f"{r['requests']} requests x {r['repeats']} rounds (medians)",
             f"{'':16}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'CPU us/req':>12}   route/them"]  # fmt: skip
    for name in ("route", "route_query", "route_local", *PEERS):
        if f"{name}_req_s" not in r:
            continue
        if r[f"{name}_req_s"] is None:
            lines.append(f"{name:16}  not measured: {r.get(f'{name}_error', '')}")
            continue
        ratio = r.get(f"route_vs_{name}")
        lines.append(
            f"{name:16}{r[f'{name}_req_s']:>10,.1f}{r[f'{name}_p50_ms']:>10,.2f}{r[f'{name}_p99_ms']:>10,.2f}"
            f"{r[f'{name}_cpu_us_per_req']:>12,.1f}   {'' if ratio is None else f'{ratio:.2f}'}"
        )
    if "route_balancer_fraction" in r:
        lines.append(
            f"route: entrypoint + balancer's tables; {r['route_balancer_fraction']} of its routes from the "
            f"balancer ({r.get('route_table_fraction')} from tables) "
            f"(fallbacks {r['route_fallbacks'] or 'none'}), ask {r['route_ask_mean_us']} us mean, "
            f"balancer CPU {r['route_balancer_cpu_us_per_req']} us/req; route_query: asks per request "
            f"(balancer CPU {r.get('route_query_balancer_cpu_us_per_req')} us/req); route_local: the entrypoint alone"
        )
    return "\n".join(lines)


def _main(args: argparse.Namespace) -> int:
    peers = tuple(p for p in args.peers.split(",") if p) if args.peers else ()
    result = run(
        args.requests,
        args.concurrency,
        args.tokens,
        args.repeats,
        args.workers,
        peers,
        Path(args.peers_dir),
        args.balancer_timeout_ms / 1e3,
        args.http_workers,
        args.ask,
    )
    print(json.dumps(result) if args.json else format_table(result))
    return 0


def _default_http_workers() -> int:
    # Half the CPUs (the client, the balancer and the echo engines share the machine), 2 to 4:
    # on 2 CPUs 2 workers still served more than 1.
    return max(2, min(4, (os.cpu_count() or 2) // 2))


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "route",
        help="gateway + balancer requests/s with echo engines beside the gateway alone, vllm-router and sglang-router",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--requests", type=int, default=512, help="requests per round and system")
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight")
    parser.add_argument("--tokens", type=int, default=16, help="output tokens per request, one per chunk")
    parser.add_argument("--repeats", type=int, default=3, help="measured rounds per system")
    parser.add_argument("--workers", type=int, default=2, help="echo engines / echo backends")
    parser.add_argument(
        "--http-workers",
        type=int,
        default=_default_http_workers(),
        help="HTTP worker processes of each entrypoint (its http_workers; default: "
        "half the CPUs, at least 2, at most 4)",
    )
    parser.add_argument(
        "--balancer-timeout-ms",
        type=float,
        default=_BALANCER_TIMEOUT_S * 1e3,
        help="how long the balanced entrypoint waits for a route before it picks locally "
        f"(default {_BALANCER_TIMEOUT_S * 1e3:g}; a deployment's default is 20)",
    )
    parser.add_argument(
        "--no-ask",
        dest="ask",
        action="store_false",
        help="leave out route_query (a third entrypoint that asks the balancer per request)",
    )
    parser.add_argument(
        "--peers",
        default=",".join(PEERS),
        help=f"comma-separated routers to measure beside (default {','.join(PEERS)}; '' for none)",
    )
    parser.add_argument(
        "--peers-dir",
        default=str(_DEFAULT_PEERS_DIR),
        help="where the routers' venv and logs go (default run/route-peers)",
    )
    parser.set_defaults(func=_main)
