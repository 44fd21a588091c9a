"""Figures of one fault of ``dsi bench chaos``, from the answers logged and two role snapshots.

    |-- baseline_s --|-- fault (fault_s; none for an instant one) --|-- until recovered --|
    base rate        inject                                          heal          end of the phase

sent / failed / spliced: requests *started* in [inject, end of the phase). Recovery: the first
``window_s`` window starting at or after the heal (the inject, for an instant fault) in which no
request failed, at least one completed, and at least ``RATE_SHARE`` of the baseline's completions
per second completed (a baseline that happened to complete nothing, every client being on a long
request, would otherwise count the first empty window as recovered, and the phase would end
before a request of its own ran);
its start minus the heal is the recovery time (None: not within the phase). Leaks: per role the
change of RSS, open fds and /dev/shm between the snapshots before the inject and after
recovery (``soak_report.growth_flags``); a role whose pid changed was replaced, and is compared
with its predecessor only for the shm files the old process left (``orphan shm``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dsi.bench.chaos_load import Answer
from dsi.bench.soak_probe import ProcFigures
from dsi.bench.soak_report import MB, GrowthLimits, growth_flags

RATE_SHARE = 0.8
Snapshot = dict[str, ProcFigures]


@dataclass(slots=True)
class Phase:
    """One fault's times (monotonic seconds) and what was measured around it."""

    name: str
    how: str = ""
    base_from: float = 0.0
    inject: float = 0.0
    heal: float = 0.0
    end: float = 0.0
    before: Snapshot = field(default_factory=dict)
    after: Snapshot = field(default_factory=dict)
    orphan_shm: tuple[int, int] = (0, 0)  # (bytes, files) of replaced processes
    min_serving: dict[str, int] = field(default_factory=dict)  # kind -> fewest serving seen
    skipped: str = ""


def completions_per_s(answers: list[Answer], t0: float, t1: float) -> float:
    done = sum(1 for a in answers if not a.error and t0 <= a.ended < t1)
    return done / max(t1 - t0, 1e-9)


def recovered_at(
    answers: list[Answer], start: float, base_rate: float, now: float, window_s: float
) -> float | None:
    """The start of the first healthy window in [start, now], stepping 0.5 s; None if none yet."""
    t = start
    while t + window_s <= now:
        failed = any(a.error and t <= a.ended < t + window_s for a in answers)
        rate = completions_per_s(answers, t, t + window_s)
        if not failed and rate > 0 and rate >= RATE_SHARE * base_rate:
            return t
        t += 0.5
    return None


def leak_rows(before: Snapshot, after: Snapshot, limits: GrowthLimits) -> dict[str, dict]:
    rows = {}
    for role in sorted({*before, *after}):
        b, a = before.get(role), after.get(role)
        if b is None or a is None:
            rows[role] = {"missing": "before" if b is None else "after", "flags": []}
            continue
        replaced = a.pid != b.pid
        rows[role] = {
            "replaced": replaced,
            "rss_mb": round((a.rss_bytes - b.rss_bytes) / MB, 1),
            "fds": a.fds - b.fds,
            "shm_files": a.shm_files - b.shm_files,
            "flags": [] if replaced else growth_flags(b, a, limits),
        }
    return rows


def phase_report(phase: Phase, answers: list[Answer], window_s: float, limits: GrowthLimits) -> dict:
    if phase.skipped:
        return {"fault": phase.name, "skipped": phase.skipped}
    mine = [a for a in answers if phase.inject <= a.started < phase.end]
    base_rate = completions_per_s(answers, phase.base_from, phase.inject)
    back = recovered_at(answers, phase.heal, base_rate, phase.end, window_s)
    leaks = leak_rows(phase.before, phase.after, limits)
    flags = [f"{role}: {flag}" for role, row in leaks.items() for flag in row["flags"]]
    if phase.orphan_shm[1]:
        flags.append(f"orphan shm: {phase.orphan_shm[1]} files, {phase.orphan_shm[0] / MB:.1f} MB")
    capacity = phase.min_serving.get("decode", 0) >= 1 and phase.min_serving.get("prefill", 0) >= 1
    failed = [a for a in mine if a.error]
    return {
        "fault": phase.name,
        "how": phase.how,
        "fault_s": round(phase.heal - phase.inject, 1),
        "sent": len(mine),
        "failed": len(failed),
        "capacity_left": capacity,
        "min_serving": phase.min_serving,
        "lost": len(failed) if capacity else 0,
        "spliced": sum(1 for a in mine if a.spliced),
        "errors": sorted({a.error for a in failed})[:5],
        "base_rate_per_s": round(base_rate, 2),
        "recovery_s": None if back is None else round(back - phase.heal, 1),
        "leaks": leaks,
        "leak_flags": flags,
    }


def format_table(report: dict) -> str:
    head = f"{'fault':<18} {'sent':>5} {'failed':>6} {'capacity':>8} {'spliced':>7} {'recovery_s':>10}  leaks"
    lines = [head, "-" * len(head)]
    for row in report["faults"]:
        if "skipped" in row:
            lines.append(f"{row['fault']:<18} skipped: {row['skipped']}")
            continue
        rec = "never" if row["recovery_s"] is None else f"{row['recovery_s']:.1f}"
        cap = "left" if row["capacity_left"] else "none"
        leaks = "; ".join(row["leak_flags"]) or "none"
        lines.append(
            f"{row['fault']:<18} {row['sent']:>5} {row['failed']:>6} {cap:>8} {row['spliced']:>7} {rec:>10}  {leaks}"
        )
    lines.append("")
    for row in report["faults"]:
        if "how" in row:
            lines.append(f"{row['fault']}: {row['how']}")
            if row["errors"]:
                lines.append(f"  errors: {'; '.join(row['errors'])}")
    lines.append(f"reference: {report['reference']['prompts']} prompts; spliced outside faults: "
                 f"{report['spliced_outside']}; verdict: {report['verdict']}")  # fmt: skip
    lines.extend(f"  {flag}" for flag in report["flags"])
    return "\n".join(lines)
