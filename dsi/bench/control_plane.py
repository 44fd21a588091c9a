"""``dsi bench control-plane``: the control plane at scale - a real controller, balancer and
entrypoint with ``--instances`` simulated engine instances heartbeating to them.

    dsi bench control-plane [--instances 1000] [--processes 4] [--prefill-share 0.5]
                            [--interval 1.0] [--timeout 5.0] [--window 10] [--tables 100]
                            [--status-runs 5] [--restarts 3] [--json]

Real: the controller, the balancer and the entrypoint, each its own ``dsi-role`` process
(dsi.bench.control_plane_cluster), with the heartbeat interval and timeout given; the entrypoint
learns the instances from the controller (a connection to each) and routes from the balancer's
tables, as deployed. Simulated: the engines - ``--processes`` processes share the instances
(half prefill, half decode by default), each instance with its own heartbeat socket, task and
Assignment bookkeeping, and a load report to the balancer every interval
(dsi.bench.control_plane_fleet). No requests are served.

Steps and figures (seconds unless named; ``median`` / ``p99`` / ``max`` over ``n`` samples):

1. ``registered_s``: from starting the simulated instances until the controller lists all as
   serving, the balancer routes to all, and the entrypoint counts all as ready.
2. ``cpu``: over ``--window`` seconds of steady state, each process's CPU seconds per wall
   second (1.0 = one core busy), sampled each second; ``fleet`` sums the simulating processes.
   ``controller_us_per_heartbeat``: the controller's mean CPU over the heartbeats it was sent
   (everything it did in the window counted against them: the gateway's and the balancer's
   ListInstances too). ``heartbeat_age_max_s`` / ``suspect`` / ``serving``: the controller's
   view of the instances at the end.
3. ``route_table``: ``--tables`` TableQuery asks 50 ms apart, each with one routed prefill and
   one routed decode, so both plans are checked (what an entrypoint under traffic asks; an idle
   one's tables are cheaper); ``build_ms`` is the balancer's own clock around making the table,
   ``round_trip_ms`` is seen from the bench process, ``take_ms`` is the gateway's
   ``decision_table`` of it here.
4. ``status``: ``dsi status --json`` run ``--status-runs`` times as a subprocess (``cli_s``: spawn
   to exit, the interpreter's start included), and 20 ListInstances asks from here (``list_ms``).
5. ``recovery``: ``--restarts`` times, the controller is SIGKILLed and started again at once
   (dsi.bench.control_plane_recovery): seconds from the kill until the controller, the balancer
   and the entrypoint are whole again, and the fewest instances each routed to meanwhile.

Goals (issue 26, at 1,000 instances and a 1 s heartbeat): route table ``build_ms`` median < 5;
controller CPU median < 0.5 of a core; recovery median < 2 heartbeat timeouts. ``goals`` says
for each the value, the bound and whether it is met. The machine is shared by every process:
on a small one the simulated instances take cores from the roles measured (see ``cpu.fleet``).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import uvloop
import zmq.asyncio

from dsi.bench.child import ServerProcess
from dsi.bench.control_plane_cluster import ControlPlane, ControlPlaneConfig
from dsi.bench.control_plane_fleet import FleetSpec, fleet_ids, serve_fleet, split
from dsi.bench.control_plane_probe import (
    Counts,
    Spread,
    cpu_fractions,
    list_round_trips,
    status_cli,
    table_builds,
    whole_counts,
)
from dsi.bench.control_plane_recovery import Recovery, watch_restart
from dsi.messages import ALL
from dsi.messages.control import InstanceTable, ListInstances
from dsi.transport.client import Peer

TABLE_BUILD_GOAL_MS = 5.0
CONTROLLER_CPU_GOAL = 0.5  # of one core
RECOVERY_GOAL_TIMEOUTS = 2.0  # heartbeat timeouts
_REGISTER_WAIT_S = 180.0
_SETTLE_S = 2.0
_TABLE_EVERY_S = 0.05
_LIST_RUNS = 20


@dataclass(slots=True, frozen=True)
class Options:
    """The bench's terms; seconds for every ``*_s``."""

    instances: int = 1000
    processes: int = 4
    prefill_share: float = 0.5
    interval_s: float = 1.0
    timeout_s: float = 5.0
    window_s: float = 10.0
    tables: int = 100
    status_runs: int = 5
    restarts: int = 3

    def __post_init__(self) -> None:
        counts = ("instances", "processes", "tables", "status_runs")
        small = [name for name in counts if getattr(self, name) < 1]
        if small or self.restarts < 0 or self.window_s < 1:
            raise ValueError(
                f"need {', '.join(counts)} >= 1, restarts >= 0 and window_s >= 1 "
                f"(got {', '.join(small) or 'restarts or window_s'} out of range)"
            )
        if not 0 < self.prefill_share < 1:
            raise ValueError(f"prefill_share must be within (0, 1), got {self.prefill_share}")


def run(opts: Options) -> dict:
    """Every figure of the bench, as printed by ``--json``."""
    return uvloop.run(_run(opts))


async def _run(opts: Options) -> dict:
    cfg = ControlPlaneConfig(opts.interval_s, opts.timeout_s)
    ids = fleet_ids(opts.instances, opts.prefill_share)
    names = frozenset(i for i, _ in ids)
    ctx = zmq.asyncio.Context()
    controller = Peer(cfg.controller, ctx, types=ALL, peer_id="bench", timeout=2.0)
    balancer = Peer(cfg.balancer, ctx, types=ALL, peer_id="bench", timeout=2.0)
    fleets: list[ServerProcess] = []
    with tempfile.TemporaryDirectory() as tmp:
        plane = ControlPlane(cfg, Path(tmp) / "control-plane.toml")
        try:
            async with aiohttp.ClientSession() as session:
                await plane.start()
                await controller.connect(30.0)
                await balancer.connect(30.0)
                health = f"{cfg.http}/health"
                probe = functools.partial(whole_counts, controller, balancer, session, health, names)
                t0 = time.monotonic()
                for group in split(ids, opts.processes):
                    spec = FleetSpec(cfg.controller, (cfg.balancer,), group, opts.interval_s)
                    fleets.append(ServerProcess(serve_fleet, spec))
                await asyncio.to_thread(lambda: [f.port for f in fleets])  # each fleet is bound
                out: dict = {
                    "terms": _terms(opts, ids),
                    "registered_s": await _until_whole(probe, len(ids), t0),
                }
                return out | await _measure(opts, plane, fleets, controller, balancer, probe, ids)
        finally:
            await asyncio.to_thread(lambda: [f.stop() for f in fleets])
            await controller.close()
            await balancer.close()
            await plane.stop()
            ctx.destroy(linger=0)


async def _measure(
    opts: Options,
    plane: ControlPlane,
    fleets: list[ServerProcess],
    controller: Peer,
    balancer: Peer,
    probe: Callable[[], Awaitable[Counts]],
    ids: list[tuple[str, str]],
) -> dict:
    """Steps 2 to 5 of the module's docstring, on a whole cluster."""
    await asyncio.sleep(_SETTLE_S)
    cpu = await _cpu(plane, fleets, opts.window_s)
    cpu |= await _freshness(controller, frozenset(i for i, _ in ids))
    beats_per_s = len(ids) / opts.interval_s
    cpu["controller_us_per_heartbeat"] = round(cpu["controller"]["mean"] / beats_per_s * 1e6, 1)
    prefills = [i for i, kind in ids if kind == "prefill"]
    decodes = [i for i, kind in ids if kind == "decode"]
    tables = await table_builds(balancer, opts.tables, _TABLE_EVERY_S, prefills, decodes)
    status = await status_cli(plane.cfg.controller, opts.status_runs, len(ids))
    listed = await list_round_trips(controller, _LIST_RUNS)
    runs = [await watch_restart(plane, probe, len(ids)) for _ in range(opts.restarts)]
    return {
        "cpu": cpu,
        "route_table": {
            "build_ms": tables.build.scaled(1e3),
            "round_trip_ms": tables.round_trip.scaled(1e3),
            "take_ms": tables.take.scaled(1e3),
            "prefills": tables.prefills,
            "decodes": tables.decodes,
        },
        "status": {"cli_s": status.scaled(1.0), "list_ms": listed.scaled(1e3)},
        "recovery": _recovery(runs),
        "goals": _goals(opts, tables.build, cpu["controller"]["median"], runs),
    }


async def _until_whole(probe: Callable[[], Awaitable[Counts]], n: int, t0: float) -> dict[str, float]:
    """Seconds from ``t0`` until each role counted all ``n`` instances; RuntimeError after a bound."""
    done: dict[str, float] = {}
    while len(done) < 3:
        counts = await probe()
        now = time.monotonic() - t0
        for role in ("controller", "balancer", "entrypoint"):
            if role not in done and getattr(counts, role) == n:
                done[role] = round(now, 3)
        if now > _REGISTER_WAIT_S:
            raise RuntimeError(f"after {_REGISTER_WAIT_S:g}s of {n} instances the roles count {counts}")
        await asyncio.sleep(0.1)
    return done


def _terms(opts: Options, ids: list[tuple[str, str]]) -> dict:
    prefills = sum(kind == "prefill" for _, kind in ids)
    return {
        "instances": opts.instances,
        "prefills": prefills,
        "decodes": len(ids) - prefills,
        "fleet_processes": min(opts.processes, opts.instances),
        "heartbeat_interval_s": opts.interval_s,
        "heartbeat_timeout_s": opts.timeout_s,
        "cpus": os.cpu_count(),
    }


async def _cpu(plane: ControlPlane, fleets: list[ServerProcess], window_s: float) -> dict:
    pids = {role.split("-")[0]: plane.pid(role) for role in plane.procs}
    pids |= {f"fleet-{k}": f.process.pid for k, f in enumerate(fleets) if f.process.pid is not None}
    samples = await cpu_fractions(pids, window_s)
    out = {name: _cores(samples[name]) for name in ("controller", "balancer", "entrypoint")}
    fleet = [
        sum(vals) for vals in zip(*(v for k, v in samples.items() if k.startswith("fleet")), strict=True)
    ]
    out["fleet"] = _cores(fleet)
    out["window_s"] = window_s
    return out


def _cores(samples: list[float]) -> dict[str, float]:
    """Cores busy (CPU s per wall s): median and max of the 1 s samples, mean over the window."""
    s = Spread.of(samples)
    return {"median": round(s.median, 4), "max": round(s.max, 4), "mean": round(statistics.fmean(samples), 4)}


async def _freshness(controller: Peer, names: frozenset[str]) -> dict:
    """The controller's view at the end of the window: oldest heartbeat and suspect instances."""
    table: InstanceTable = await controller.ask(ListInstances(), timeout=5.0)
    mine = [i for i in table.instances if i.instance_id in names]
    return {
        "heartbeat_age_max_s": round(max(i.last_seen_s for i in mine), 3),
        "suspect": sum(i.suspect for i in mine),
        "serving": sum(i.state == "serving" for i in mine),
    }


def _recovery(runs: list[Recovery]) -> dict:
    def median(values: list[float | None]) -> float | None:
        return None if not values or None in values else round(statistics.median(values), 3)  # type: ignore[type-var]

    return {
        "total_s": median([r.total_s for r in runs]),
        "ready_s": median([r.ready_s for r in runs]),
        "controller_s": median([r.controller_s for r in runs]),
        "balancer_s": median([r.balancer_s for r in runs]),
        "entrypoint_s": median([r.entrypoint_s for r in runs]),
        "balancer_min": min((r.balancer_min for r in runs), default=-1),
        "entrypoint_min": min((r.entrypoint_min for r in runs), default=-1),
        "runs": len(runs),
    }


def _goals(opts: Options, build: Spread, controller_cpu: float, runs: list[Recovery]) -> dict:
    recovery = _recovery(runs)["total_s"]
    bound_s = RECOVERY_GOAL_TIMEOUTS * opts.timeout_s
    return {
        "route_table_build_ms": _goal(round(build.median * 1e3, 3), TABLE_BUILD_GOAL_MS),
        "controller_cpu_cores": _goal(controller_cpu, CONTROLLER_CPU_GOAL),
        "recovery_s": _goal(recovery, bound_s) if runs else {"value": None, "below": bound_s, "met": None},
    }


def _goal(value: float | None, below: float) -> dict:
    return {"value": value, "below": below, "met": value is not None and value < below}


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "control-plane", help="controller, balancer and entrypoint with many simulated instances"
    )
    d = Options()
    parser.add_argument("--instances", type=int, default=d.instances, help="simulated engine instances")
    parser.add_argument("--processes", type=int, default=d.processes, help="processes that simulate them")
    parser.add_argument("--prefill-share", type=float, default=d.prefill_share, help="share of prefills")
    parser.add_argument("--interval", type=float, default=d.interval_s, help="heartbeat interval, seconds")
    parser.add_argument("--timeout", type=float, default=d.timeout_s, help="heartbeat timeout, seconds")
    parser.add_argument("--window", type=float, default=d.window_s, help="CPU window, seconds")
    parser.add_argument("--tables", type=int, default=d.tables, help="route tables asked for")
    parser.add_argument("--status-runs", type=int, default=d.status_runs, help="dsi status processes")
    parser.add_argument("--restarts", type=int, default=d.restarts, help="controller restarts")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    opts = Options(
        args.instances,
        args.processes,
        args.prefill_share,
        args.interval,
        args.timeout,
        args.window,
        args.tables,
        args.status_runs,
        args.restarts,
    )
    figures = run(opts)
    print(json.dumps(figures) if args.json else format_figures(figures))
    return 0


def format_figures(figures: dict) -> str:
    """One line per figure (``section.name  value``), then one line per goal."""
    lines = []
    for section, values in figures.items():
        if section == "goals":
            continue
        for name, value in values.items() if isinstance(values, dict) else [("", values)]:
            lines.append(f"{section + '.' + name if name else section:32} {value}")
    for name, goal in figures["goals"].items():
        verdict = "met" if goal["met"] else "NOT met"
        lines.append(f"goal {name:27} {goal['value']} < {goal['below']}: {verdict}")
    return "\n".join(lines)
