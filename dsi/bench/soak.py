"""``dsi bench soak``: ``dsi serve`` under steady mixed load for N minutes, with a random kill
every few minutes; what each role holds at the start, after warm-up and at the end.

    dsi bench soak [--minutes 20] [--kill-every-s 180] [--warmup-s 60] [--concurrency 8]
                   [--config FILE] [--seed 0] [--json]

Timeline (seconds from the moment the cluster is up)::

    0            warmup_s              warmup_s + k * kill_every_s            minutes * 60
    |-- load ----|-- load, kills -----------------------------------------|-- settle, end --|
    start snap   warm snap             SIGKILL a random serving role           end snap, stop
    (no load)    (under load)          (not within settle_s of the end)        (under load)

The config is copied with free ports and a private run directory (``soak_cluster``), so a soak
never collides with another cluster on the machine. The load is ``soak_load`` (four kinds of
chat completions). A kill takes the kinds in ``--kill-kinds`` in turn (default: decode, prefill,
kvstore, controller, shuffled by the seed for each round; the single entrypoint is the
client's door, so killing it fails requests by design) and SIGKILLs a random serving instance
of the kind, only while every role serves.
The controller's table is sampled every second: a replacement's time to serve, and the spans
with no serving decode (or, with prefill roles, no serving prefill): no capacity, the only
time a failed request is excused. Per role, /proc/<pid>/status VmRSS, /proc/<pid>/fd and the
/dev/shm files it created (``soak_probe``); growth between the warm and end snapshots is flagged
above the limits of ``soak_report.GrowthLimits``. After the end serve is stopped (SIGINT): it
must exit 0 and leave no role process and no shm file of a live-at-the-end process behind.

Exit status 0 when the verdict is "pass": no flag, no failure outside no-capacity spans.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from dsi import paths
from dsi.bench.soak_cluster import ServedCluster, private_config, wait_gone
from dsi.bench.soak_load import LoadLog, run_load
from dsi.bench.soak_probe import alive, figures, orphan_shm, shm_by_pid
from dsi.bench.soak_report import GrowthLimits, Snapshot, excused, format_summary, role_rows

DEFAULT_KINDS = ("decode", "prefill", "kvstore", "controller")
_SAMPLE_S = 1.0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("soak", help="dsi serve under mixed load with random kills; growth per role")
    p.add_argument("--minutes", type=float, default=20.0, help="length of the soak, warm-up included")
    p.add_argument("--kill-every-s", type=float, default=180.0, help="seconds between kills (0: none)")
    p.add_argument("--warmup-s", type=float, default=60.0, help="seconds of load before the warm snapshot")
    p.add_argument("--settle-s", type=float, default=45.0, help="no kill this close to the end (seconds)")
    p.add_argument("--concurrency", type=int, default=8, help="clients sending requests")
    p.add_argument("--kill-kinds", default=",".join(DEFAULT_KINDS), help="role kinds a kill may pick")
    p.add_argument("--config", default=None, help="cluster config to copy (default dsi's configs/local.toml)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rss-growth-pct", type=float, default=GrowthLimits().rss_pct)
    p.add_argument("--fd-growth", type=int, default=GrowthLimits().fds)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.minutes * 60 <= args.warmup_s or args.concurrency < 1 or args.kill_every_s < 0:
        print(
            "dsi bench soak: --minutes must exceed --warmup-s, --concurrency >= 1, --kill-every-s >= 0",
            file=sys.stderr,
        )
        return 2
    unknown = set(args.kill_kinds.split(",")) - {*DEFAULT_KINDS, "entrypoint", "balancer"}
    if unknown:
        print(f"dsi bench soak: --kill-kinds: unknown role kinds {sorted(unknown)}", file=sys.stderr)
        return 2
    args.config = args.config or str(paths.config("local.toml"))
    workdir = Path(tempfile.mkdtemp(prefix="dsi-soak-"))
    limits = GrowthLimits(rss_pct=args.rss_growth_pct, fds=args.fd_growth)
    try:
        report = asyncio.run(_Soak(args, workdir, limits).run())
    finally:
        shutil.rmtree(workdir / "run", ignore_errors=True)
    print(json.dumps(report, indent=2) if args.json else format_summary(report))
    return 0 if report["verdict"] == "pass" else 1


@dataclass(slots=True)
class _Kill:
    at: float  # monotonic seconds
    role: str
    pid: int
    back_at: float | None = None


@dataclass(slots=True)
class _Watch:
    """What the table sampler learnt: the pid of each role now, every pid seen, no-capacity spans."""

    pids: dict[str, int] = field(default_factory=dict)
    states: dict[str, str] = field(default_factory=dict)  # an id missing from a table keeps its last state
    kinds: dict[str, str] = field(default_factory=dict)
    seen: set[int] = field(default_factory=set)
    no_capacity: list[tuple[float, float]] = field(default_factory=list)
    _since: float | None = None

    def update(self, table, kinds: set[str], now: float) -> None:
        """A restarted controller lists instances as their heartbeats come back: one it has not
        heard from yet is not gone, so its last known state stands."""
        for info in table:
            self.states[info.instance_id] = info.state
            self.kinds[info.instance_id] = info.role
            if info.state == "serving":
                self.pids[info.instance_id] = info.pid
            self.seen.add(info.pid)
        serving = {self.kinds[i] for i, state in self.states.items() if state == "serving"}
        short = "decode" not in serving or ("prefill" in kinds and "prefill" not in serving)
        if short and self._since is None:
            self._since = now
        elif not short and self._since is not None:
            self.no_capacity.append((self._since, now))
            self._since = None

    def spans(self, now: float) -> list[tuple[float, float]]:
        return self.no_capacity + ([(self._since, now)] if self._since is not None else [])


class _Soak:
    def __init__(self, args: argparse.Namespace, workdir: Path, limits: GrowthLimits) -> None:
        self.args, self.limits = args, limits
        self.cluster = ServedCluster(private_config(Path(args.config), workdir), workdir)
        self.kinds = {role.kind for role in self.cluster.cfg.roles}
        self.watch = _Watch()
        self.kills: list[_Kill] = []
        self.rng = random.Random(args.seed)

    async def run(self) -> dict:
        args = self.args
        await asyncio.to_thread(self.cluster.start)
        try:
            await self._sample()
            t0 = time.monotonic()
            start = self._snapshot()
            stop, log = asyncio.Event(), LoadLog()
            load = asyncio.create_task(run_load(self.cluster.gateway, args.concurrency, stop, log, args.seed))
            sampler = asyncio.create_task(self._sample_forever())
            await asyncio.sleep(args.warmup_s)
            warm = self._snapshot()
            await self._kill_until(t0 + args.minutes * 60 - args.settle_s)
            await self._until_serving(t0 + args.minutes * 60 + 60)
            await asyncio.sleep(max(0.0, t0 + args.minutes * 60 - time.monotonic()))
            end = self._snapshot()
            orphans = orphan_shm(shm_by_pid(), self.watch.seen)  # now: a live process's files are not orphans
            stop.set()
            await load
            sampler.cancel()
            now = time.monotonic()
        finally:
            code = await asyncio.to_thread(self.cluster.stop)
        left = wait_gone(self.watch.seen, 10.0, alive)
        return self._report(t0, now, start, warm, end, orphans, log, code, left)

    async def _sample(self) -> None:
        table = await self.cluster.table()
        if table is not None:
            self.watch.update(table, self.kinds, time.monotonic())
            for kill in self.kills:
                if kill.back_at is None and self.watch.pids.get(kill.role, kill.pid) != kill.pid:
                    kill.back_at = time.monotonic()

    async def _sample_forever(self) -> None:
        while True:
            await self._sample()
            await asyncio.sleep(_SAMPLE_S)

    async def _kill_until(self, last: float) -> None:
        """A kill every kill_every_s until `last`; each only while every role serves."""
        every = self.args.kill_every_s
        if every <= 0:
            return
        kinds = set(self.args.kill_kinds.split(","))
        cycle: list[str] = []
        while time.monotonic() + every < last:
            await asyncio.sleep(every)
            await self._until_serving(last)
            if not cycle:  # every kind in turn, in a shuffled order, so that a short soak kills each
                cycle = self.rng.sample(sorted(kinds), len(kinds))
            kind = cycle.pop()
            candidates = sorted(
                r
                for r, s in self.watch.states.items()
                if s == "serving" and self.watch.kinds.get(r) == kind and r in self.watch.pids
            )
            if time.monotonic() > last:
                return
            if not candidates:
                continue
            role = self.rng.choice(candidates)
            pid = self.watch.pids[role]
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.kills.append(_Kill(time.monotonic(), role, pid))

    async def _until_serving(self, deadline: float) -> None:
        """Until every role of the config is serving (and no kill is still waiting for its
        replacement), or `deadline` passes."""
        wanted = {role.id for role in self.cluster.cfg.roles}
        while time.monotonic() < deadline:
            serving = {r for r, s in self.watch.states.items() if s == "serving"}
            if wanted <= serving and all(k.back_at is not None for k in self.kills):
                return
            await asyncio.sleep(_SAMPLE_S)

    def _snapshot(self) -> Snapshot:
        shm = shm_by_pid()
        pids = {**self.watch.pids, "serve": self.cluster.pid}
        snap = {role: figures(pid, shm) for role, pid in pids.items()}
        return {role: f for role, f in snap.items() if f is not None}

    def _report(
        self,
        t0: float,
        now: float,
        start: Snapshot,
        warm: Snapshot,
        end: Snapshot,
        orphans: tuple[int, int],
        log: LoadLog,
        code: int | None,
        left: set[int],
    ) -> dict:
        args = self.args
        spans = self.watch.spans(now)
        slack = 15.0  # heartbeat timeout, table refresh and the gateway's re-route wait
        failed = [r for r in log.results if r.error]
        unexcused = [r for r in failed if not excused(r.started, r.ended, spans, slack)]
        rows = role_rows(start, warm, end, self.limits)
        flags = [f"{role}: {flag}" for role, row in rows.items() for flag in row["flags"]]
        flags += [f"request failed with capacity left ({r.kind}): {r.error}" for r in unexcused[:10]]
        if code != 0:
            flags.append(f"dsi serve exited with {code}")
        if left:
            flags.append(f"processes left running after serve stopped: {sorted(left)}")
        after_stop = orphan_shm(shm_by_pid(), self.watch.seen | {self.cluster.pid})
        return {
            "minutes": args.minutes,
            "kill_every_s": args.kill_every_s,
            "warmup_s": args.warmup_s,
            "concurrency": args.concurrency,
            "config": args.config,
            "log": str(self.cluster.log_path),
            "roles": rows,
            "requests": {
                "total": len(log.results),
                "ok": len(log.results) - len(failed),
                "failed": len(failed),
                "failed_without_capacity": len(failed) - len(unexcused),
                "failed_with_capacity": len(unexcused),
                "by_kind": log.counts(),
                "errors": sorted({r.error for r in failed})[:10],
            },
            "kills": [
                {
                    "at_s": k.at - t0,
                    "role": k.role,
                    "pid": k.pid,
                    "back_after_s": None if k.back_at is None else k.back_at - k.at,
                }
                for k in self.kills
            ],
            "no_capacity_s": [[a - t0, b - t0] for a, b in spans],
            "shm_orphans": {"bytes": orphans[0], "files": orphans[1]},
            "after_stop": {
                "serve_exit": code,
                "processes_left": sorted(left),
                "shm_bytes": after_stop[0],
                "shm_files": after_stop[1],
            },
            "flags": flags,
            "verdict": "pass" if not flags else "fail",
        }
