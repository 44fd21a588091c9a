"""``dsi bench chaos``: faults beyond a dead process under steady greedy load, one after another;
per fault whether requests were lost or spliced, how long until the rate came back, and what
each role holds before and after.

    dsi bench chaos [--faults partition-kv,delay-loss,partition-prefill,sigstop,kv-full,controller]
                    [--fault-s 30] [--load 4] [--baseline-s 10] [--recover-max-s 60]
                    [--window-s 4] [--prompts 24] [--kv-mb 64] [--json]

The cluster (``chaos_cluster``) is six hosts in network namespaces (``chaos_netns``), one
``dsi serve`` each: gateway + controller, two prefills, two decodes, a kvstore. Timeline::

    up --> reference: each prompt once, undisturbed --> load (--load clients, round-robin)
       --> for each fault: every role serving --> baseline_s --> snapshot --> inject
           --> fault_s --> heal --> until recovered (at most recover_max_s) --> snapshot
       --> load stops --> every serve SIGINT --> namespaces deleted

What each fault does and how its figures are counted: ``chaos_faults``, ``chaos_report``.
Exit 0 when the verdict is "pass": no fault lost a request while capacity was left, none
spliced one, each recovered, no leak was flagged, every serve exited 0. Exit 2 where network
namespaces cannot be made (the reason is printed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from dsi.bench.chaos_cluster import ROLE_HOST, ChaosCluster
from dsi.bench.chaos_faults import FAULTS, FaultRun, FaultSkipped
from dsi.bench.chaos_load import AnswerLog, prompt_pool, reference, run_load
from dsi.bench.chaos_netns import Fabric, NetnsUnavailable
from dsi.bench.chaos_report import Phase, Snapshot, format_table, phase_report, recovered_at
from dsi.bench.soak_probe import alive, figures, orphan_shm, shm_by_pid
from dsi.bench.soak_report import GrowthLimits

_SAMPLE_S = 1.0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "chaos", help="network, process and disk faults under greedy load: lost, spliced, recovery"
    )
    p.add_argument("--faults", default=",".join(FAULTS), help=f"faults in order (of {', '.join(FAULTS)})")
    p.add_argument("--fault-s", type=float, default=30.0, help="how long each fault lasts (seconds)")
    p.add_argument("--load", type=int, default=4, help="clients sending requests")
    p.add_argument("--baseline-s", type=float, default=10.0, help="undisturbed load before each fault (s)")
    p.add_argument("--recover-max-s", type=float, default=60.0, help="longest wait for recovery (s)")
    p.add_argument("--window-s", type=float, default=4.0, help="window a recovered rate is judged on (s)")
    p.add_argument("--prompts", type=int, default=24, help="distinct prompts in the pool")
    p.add_argument("--kv-mb", type=int, default=64, help="size of the kvstore's tmpfs (MiB)")
    p.add_argument("--workdir", default=None, help="configs and logs (default: a new temporary directory)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    names = [n for n in args.faults.split(",") if n]
    unknown = [n for n in names if n not in FAULTS]
    if unknown or args.fault_s <= 0 or args.load < 1 or args.prompts < 2:
        print(f"dsi bench chaos: unknown faults {unknown} (known: {', '.join(FAULTS)}), or --fault-s <= 0, "
              "--load < 1, --prompts < 2", file=sys.stderr)  # fmt: skip
        return 2
    try:
        fabric = Fabric.create()
    except NetnsUnavailable as exc:
        print(f"dsi bench chaos: no network namespaces here: {exc}", file=sys.stderr)
        return 2
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="dsi-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        report = asyncio.run(_Chaos(args, names, fabric, workdir).run())
    finally:
        fabric.close()
    print(json.dumps(report, indent=2) if args.json else format_table(report))
    return 0 if report["verdict"] == "pass" else 1


class _Chaos:
    def __init__(self, args: argparse.Namespace, names: list[str], fabric: Fabric, workdir: Path) -> None:
        self.args, self.names, self.workdir = args, names, workdir
        self.cluster = ChaosCluster(fabric, workdir, args.kv_mb)
        self.states: dict[str, tuple[str, str, int]] = {}  # role id -> (kind, state, pid)
        self.phase: Phase | None = None
        self.limits = GrowthLimits()

    async def run(self) -> dict:
        args, log = self.args, AnswerLog()
        phases: list[Phase] = []
        try:
            await asyncio.to_thread(self.cluster.start)
            sampler = asyncio.create_task(self._sample_forever())
            await self._until_serving(120.0)
            await self._until_healthy(60.0)
            pool = prompt_pool(args.prompts)
            expected = await reference(self.cluster.gateway, pool, args.load)
            stop = asyncio.Event()
            load = asyncio.create_task(run_load(self.cluster.gateway, pool, expected, args.load, stop, log))
            for name in self.names:
                phases.append(await self._fault(name, log))
            stop.set()
            await load
            sampler.cancel()
        finally:
            codes = await asyncio.to_thread(self.cluster.stop)
            self.cluster.close()
        rows = [phase_report(p, log.answers, args.window_s, self.limits) for p in phases]
        inside = [(p.inject, p.end) for p in phases]
        outside = [a for a in log.answers if a.spliced and not any(s <= a.started < e for s, e in inside)]
        return self._report(rows, len(pool), len(log.answers), len(outside), codes)

    async def _fault(self, name: str, log: AnswerLog) -> Phase:
        args, fault = self.args, FAULTS[name]
        await self._until_serving(60.0)
        phase = Phase(name, base_from=time.monotonic())
        await asyncio.sleep(args.baseline_s)
        phase.before = self._snapshot()
        run = FaultRun(self.cluster, self._pids)
        for kind in ("prefill", "decode"):  # a fault whose table cannot be read keeps these
            phase.min_serving[kind] = sum(
                1 for k, s, _ in self.states.values() if k == kind and s == "serving"
            )
        self.phase, phase.inject = phase, time.monotonic()
        try:
            await asyncio.to_thread(fault.inject, run)
        except FaultSkipped as exc:
            phase.skipped = str(exc)
            fault.heal(run)
            self.phase = None
            return phase
        except Exception:
            await asyncio.to_thread(fault.heal, run)
            raise
        phase.how = run.how
        if not fault.instant:
            await asyncio.sleep(args.fault_s)
            await asyncio.to_thread(fault.heal, run)
        phase.heal = time.monotonic() if not fault.instant else phase.inject
        base = (sum(1 for a in log.answers if not a.error and phase.base_from <= a.ended < phase.inject)
                / max(phase.inject - phase.base_from, 1e-9))  # fmt: skip
        while time.monotonic() < phase.heal + args.recover_max_s:
            if recovered_at(log.answers, phase.heal, base, time.monotonic(), args.window_s) is not None:
                break
            await asyncio.sleep(0.5)
        await self._until_serving(30.0)
        await asyncio.sleep(2.0)  # a replaced role's first requests, before its figures are read
        phase.after = self._snapshot()
        gone = {f.pid for f in phase.before.values() if not alive(f.pid)}
        phase.orphan_shm = orphan_shm(shm_by_pid(), gone)
        phase.end, self.phase = time.monotonic(), None
        return phase

    def _pids(self) -> dict[str, int]:
        return {rid: pid for rid, (_, state, pid) in self.states.items() if state not in ("dead", "stopped")}

    def _snapshot(self) -> Snapshot:
        shm = shm_by_pid()
        pids = {**self._pids(), **self.cluster.serve_pids()}
        snap = {role: figures(pid, shm) for role, pid in pids.items()}
        return {role: f for role, f in snap.items() if f is not None}

    async def _sample_forever(self) -> None:
        while True:
            table = await self.cluster.table()
            for info in table or ():  # an id missing from a restarted controller's table keeps its state
                self.states[info.instance_id] = (info.role, info.state, info.pid)
            if table is not None and self.phase is not None:
                for kind in ("prefill", "decode"):
                    n = sum(1 for k, s, _ in self.states.values() if k == kind and s == "serving")
                    self.phase.min_serving[kind] = min(n, self.phase.min_serving.get(kind, n))
            await asyncio.sleep(_SAMPLE_S)

    async def _until_serving(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(self.states.get(rid, ("", "", 0))[1] == "serving" for rid in ROLE_HOST):
                return True
            await asyncio.sleep(0.5)
        return False

    async def _until_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as http:
            while time.monotonic() < deadline:
                try:
                    async with http.get(f"{self.cluster.gateway}/health") as resp:
                        if resp.status == 200:
                            return
                except (aiohttp.ClientError, TimeoutError):
                    pass
                await asyncio.sleep(0.5)
        raise RuntimeError(f"the gateway {self.cluster.gateway} was not healthy in {timeout_s:g}s")

    def _report(self, rows: list[dict], prompts: int, total: int, outside: int, codes: dict) -> dict:
        flags = []
        for row in rows:
            if "skipped" in row:
                continue
            name = row["fault"]
            if row["lost"]:
                flags.append(f"{name}: {row['lost']} requests failed with capacity left")
            if row["spliced"]:
                flags.append(f"{name}: {row['spliced']} completed answers differ from the reference")
            if row["recovery_s"] is None:
                flags.append(f"{name}: the rate did not come back within {self.args.recover_max_s:g}s")
            flags.extend(f"{name}: {flag}" for flag in row["leak_flags"])
        if outside:
            flags.append(f"{outside} answers outside the faults differ from the reference")
        flags.extend(f"dsi serve on {host} exited with {code}" for host, code in codes.items() if code != 0)
        return {
            "fault_s": self.args.fault_s,
            "load": self.args.load,
            "baseline_s": self.args.baseline_s,
            "workdir": str(self.workdir),
            "kv_tmpfs": self.cluster.kv_mounted,
            "reference": {"prompts": prompts},
            "requests": total,
            "faults": rows,
            "spliced_outside": outside,
            "serve_exit": codes,
            "flags": flags,
            "verdict": "pass" if not flags else "fail",
        }
