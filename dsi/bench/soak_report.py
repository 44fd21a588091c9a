"""What a soak found: per-role growth between two snapshots, the requests, the kills, the verdict.

Growth is judged between the snapshot after warm-up and the one at the end (both under load).
A role is flagged when its resident memory grew more than ``rss_pct`` percent and more than
``rss_min_bytes`` (small processes jitter by a few MB), its open fds by more than ``fds``, or
its shm bytes by more than ``shm_bytes``. A role replaced meanwhile is compared all the same
(its replacement must not hold more than the process it replaced).
"""

from __future__ import annotations

from dataclasses import dataclass

from dsi.bench.soak_probe import ProcFigures

Snapshot = dict[str, ProcFigures]  # role id ("serve" for dsi serve itself) -> figures
MB = 1 << 20


@dataclass(frozen=True, slots=True)
class GrowthLimits:
    rss_pct: float = 10.0
    rss_min_bytes: int = 16 * MB
    fds: int = 8
    shm_bytes: int = 16 * MB


def growth_flags(warm: ProcFigures, end: ProcFigures, limits: GrowthLimits) -> list[str]:
    """Why the change from `warm` to `end` counts as growth (empty: it does not)."""
    flags = []
    rss = end.rss_bytes - warm.rss_bytes
    if rss > limits.rss_min_bytes and rss > warm.rss_bytes * limits.rss_pct / 100:
        flags.append(f"rss +{rss / MB:.1f} MB ({100 * rss / max(warm.rss_bytes, 1):.0f}%)")
    if end.fds - warm.fds > limits.fds:
        flags.append(f"fds +{end.fds - warm.fds}")
    if end.shm_bytes - warm.shm_bytes > limits.shm_bytes:
        flags.append(f"shm +{(end.shm_bytes - warm.shm_bytes) / MB:.1f} MB")
    return flags


def role_rows(start: Snapshot, warm: Snapshot, end: Snapshot, limits: GrowthLimits) -> dict[str, dict]:
    """Per role: the three snapshots (None where the process was not there), growth and flags."""
    rows = {}
    for role in sorted({*start, *warm, *end}):
        a, w, e = start.get(role), warm.get(role), end.get(role)
        row: dict = {
            "start": a and a.to_json(),
            "warm": w and w.to_json(),
            "end": e and e.to_json(),
            "replaced": w is not None and e is not None and w.pid != e.pid,
            "flags": [],
        }
        if w is not None and e is not None:
            row["growth"] = {
                "rss_bytes": e.rss_bytes - w.rss_bytes,
                "fds": e.fds - w.fds,
                "shm_bytes": e.shm_bytes - w.shm_bytes,
            }
            row["flags"] = growth_flags(w, e, limits)
        elif e is None:
            row["flags"] = ["not running at the end"]
        rows[role] = row
    return rows


def excused(started: float, ended: float, windows: list[tuple[float, float]], slack_s: float) -> bool:
    """True when a request that ran [started, ended] overlaps a no-capacity window (widened by
    `slack_s` after it: the gateway's re-route wait and its table refresh)."""
    return any(started <= w_end + slack_s and ended >= w_start for w_start, w_end in windows)


def format_summary(report: dict) -> str:
    """The report as a few aligned lines for a terminal."""
    lines = [
        f"dsi bench soak: {report['minutes']:g} min, {len(report['kills'])} kills, verdict {report['verdict']}",
        f"{'ROLE':14} {'RSS MB start/warm/end':>24} {'FDS s/w/e':>12} {'SHM MB s/w/e':>18}  FLAGS",
    ]
    for role, row in report["roles"].items():
        snaps = [row[k] for k in ("start", "warm", "end")]
        rss = "/".join("-" if s is None else f"{s['rss_bytes'] / MB:.0f}" for s in snaps)
        fds = "/".join("-" if s is None else str(s["fds"]) for s in snaps)
        shm = "/".join("-" if s is None else f"{s['shm_bytes'] / MB:.1f}" for s in snaps)
        mark = " (replaced)" if row["replaced"] else ""
        lines.append(f"{role:14} {rss:>24} {fds:>12} {shm:>18}  {'; '.join(row['flags']) or 'ok'}{mark}")
    req = report["requests"]
    lines.append(
        f"requests: {req['total']} sent, {req['failed']} failed ({req['failed_without_capacity']} while "
        f"no capacity was left, {req['failed_with_capacity']} otherwise)"
    )
    for kill in report["kills"]:
        back = "not back" if kill["back_after_s"] is None else f"back after {kill['back_after_s']:.1f}s"
        lines.append(f"  kill at {kill['at_s']:.0f}s: {kill['role']} (pid {kill['pid']}), {back}")
    shm, after = report["shm_orphans"], report["after_stop"]
    lines.append(
        f"/dev/shm files of dead cluster processes at the end: {shm['files']} ({shm['bytes'] / MB:.1f} MB)"
    )
    lines.append(
        f"after stopping serve: exit {after['serve_exit']}, {len(after['processes_left'])} processes left, "
        f"{after['shm_files']} shm files left ({after['shm_bytes'] / MB:.1f} MB)"
    )
    lines.append(f"every role's log: {report['log']}")
    lines += [f"FLAG: {flag}" for flag in report["flags"]]
    return "\n".join(lines)
