"""What ``dsi bench control-plane`` measures, each probe against the running role processes.

    cpu_fractions     CPU seconds per wall second of some processes (user + system, all threads,
                      from /proc), one sample per ``step_s``
    whole_counts      how many of the simulated instances the controller lists as ``serving``,
                      the balancer routes to (``serving`` with a load report) and the entrypoint's
                      /health counts as ready (decode + prefill); -1 where a role did not answer
    table_builds      TableQuery asks as an entrypoint sends them, each carrying one routed
                      prefill and one routed decode so that both plans are checked (the costlier
                      table): ``build_s`` of each RouteTable (the balancer's own clock), the
                      round trip seen here, and what the gateway's take of the table
                      (``decision_table``) costs in this process
    status_cli        ``dsi status --json`` as a subprocess, wall seconds from spawn to exit
    list_round_trips  ListInstances asks from this process (what ``dsi status`` asks first)

Seconds everywhere, from ``time.perf_counter`` / ``time.monotonic``.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from dataclasses import dataclass

import aiohttp

from dsi.bench.child import process_cpu_s
from dsi.errors import DsiError
from dsi.messages.balancer import BalancerState, BalancerStatus, RoutedRequest, RouteTable, TableQuery
from dsi.messages.control import InstanceTable, ListInstances
from dsi.roles.entrypoint.route_table import decision_table
from dsi.transport.client import Peer

_ASK_S = 1.0  # how long one probe waits for a role's answer


@dataclass(slots=True, frozen=True)
class Spread:
    """Summary of samples (in the unit the caller names): median, p99, max and their count."""

    median: float
    p99: float
    max: float
    n: int

    @classmethod
    def of(cls, samples: list[float]) -> Spread:
        if not samples:
            raise ValueError("no samples to summarise")
        ordered = sorted(samples)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        return cls(statistics.median(ordered), p99, ordered[-1], len(ordered))

    def scaled(self, factor: float, digits: int = 3) -> dict[str, float]:
        """The figures times ``factor`` (1e3: seconds -> ms), rounded, for printing."""
        return {
            "median": round(self.median * factor, digits),
            "p99": round(self.p99 * factor, digits),
            "max": round(self.max * factor, digits),
            "n": self.n,
        }


async def cpu_fractions(pids: dict[str, int], window_s: float, step_s: float = 1.0) -> dict[str, list[float]]:
    """Per name, the CPU seconds its process used per wall second, one sample per ``step_s``."""
    samples: dict[str, list[float]] = {name: [] for name in pids}
    last = {name: process_cpu_s(pid) for name, pid in pids.items()}
    at = time.monotonic()
    for _ in range(max(1, round(window_s / step_s))):
        await asyncio.sleep(step_s)
        now = time.monotonic()
        for name, pid in pids.items():
            cpu = process_cpu_s(pid)
            samples[name].append((cpu - last[name]) / (now - at))
            last[name] = cpu
        at = now
    return samples


@dataclass(slots=True, frozen=True)
class Counts:
    """Simulated instances each role counts as able to take work; -1: no answer in time."""

    controller: int
    balancer: int
    entrypoint: int


async def whole_counts(
    controller: Peer, balancer: Peer, session: aiohttp.ClientSession, health_url: str, ids: frozenset[str]
) -> Counts:
    """The three counts, asked concurrently."""
    return Counts(
        *await asyncio.gather(_listed(controller, ids), _routed(balancer, ids), _ready(session, health_url))
    )


async def _listed(peer: Peer, ids: frozenset[str]) -> int:
    try:
        table: InstanceTable = await peer.ask(ListInstances(), timeout=_ASK_S)
    except DsiError:
        return -1
    return sum(1 for i in table.instances if i.instance_id in ids and i.state == "serving")


async def _routed(peer: Peer, ids: frozenset[str]) -> int:
    try:
        state: BalancerState = await peer.ask(BalancerStatus(), timeout=_ASK_S)
    except DsiError:
        return -1
    return sum(1 for v in state.instances if v.instance_id in ids and v.state == "serving")


async def _ready(session: aiohttp.ClientSession, url: str) -> int:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=_ASK_S)) as resp:
            body = await resp.json()
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return -1
    return int(body.get("instances", 0)) + int(body.get("prefill_instances", 0))


@dataclass(slots=True, frozen=True)
class TableFigures:
    """Seconds per table: made in the balancer, asked from here, taken as the gateway takes it;
    and the size of the last table (instances, encoded bytes are not known here)."""

    build: Spread
    round_trip: Spread
    take: Spread
    prefills: int
    decodes: int


async def table_builds(
    peer: Peer, samples: int, every_s: float, prefills: list[str], decodes: list[str]
) -> TableFigures:
    """``samples`` TableQuery asks, one per ``every_s``; the routed requests name the simulated
    instances in turn (they stay pending on them until the balancer's pending TTL)."""
    builds, trips, takes = [], [], []
    table: RouteTable | None = None
    for k in range(samples):
        routed = [
            RoutedRequest("prefill", prefills[k % len(prefills)], 2_000, 0),
            RoutedRequest("decode", decodes[k % len(decodes)], 2_000),
        ]
        t0 = time.perf_counter()
        table = await peer.ask(TableQuery(routed, k + 1), timeout=2.0)
        trips.append(time.perf_counter() - t0)
        t1 = time.perf_counter()
        decision_table(table)
        takes.append(time.perf_counter() - t1)
        builds.append(table.build_s)
        await asyncio.sleep(every_s)
    assert table is not None
    return TableFigures(
        Spread.of(builds), Spread.of(trips), Spread.of(takes), len(table.prefills), len(table.decodes)
    )


async def status_cli(address: str, runs: int, expect: int) -> Spread:
    """Wall seconds of ``runs`` ``dsi status --json`` processes; RuntimeError when one fails or
    lists fewer than ``expect`` instances."""
    argv = [sys.executable, "-P", "-m", "dsi.cli.main", "status", "--controller", address, "--json"]
    walls = []
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await proc.communicate()
        walls.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise RuntimeError(f"dsi status exited {proc.returncode}: {err.decode(errors='replace')[-500:]}")
        listed = len(json.loads(out)["instances"])
        if listed < expect:
            raise RuntimeError(f"dsi status listed {listed} instances, expected at least {expect}")
    return Spread.of(walls)


async def list_round_trips(peer: Peer, runs: int) -> Spread:
    """Seconds per ListInstances ask (every role), ``runs`` of them one after the other."""
    trips = []
    for _ in range(runs):
        t0 = time.perf_counter()
        await peer.ask(ListInstances(), timeout=5.0)
        trips.append(time.perf_counter() - t0)
    return Spread.of(trips)
