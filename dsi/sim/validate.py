"""``dsi sim validate``: the simulator against a real ``dsi serve`` on this machine.

1. the ``cpu`` profile: ``dsi bench engine``'s figures, measured now or read from a file
2. measured: a small Mooncake slice (:mod:`dsi.sim.validate_slice`) replayed open loop
   against a private ``dsi serve`` of configs/local.toml (:mod:`dsi.sim.validate_serve`)
3. simulated: the same requests (same token pages, same arrival times) through a cluster of
   the same prefill and decode instances, hit policy and persist rule, on the cpu profile
4. compared (:class:`Comparison`): TTFT p50 and p90 of each side, the relative error of the
   simulated p50, ``(simulated - measured) / measured``, and the hit-rate difference,
   simulated - measured (hit rate = prompt tokens the prefills took from the store / prompt
   tokens; measured from each response's ``cached_tokens``)
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from dsi import paths
from dsi.config import load_config
from dsi.sim.cluster import Cluster
from dsi.sim.config import SimConfig
from dsi.sim.cost import CostModel
from dsi.sim.profiles import HardwareProfile, cpu_profile
from dsi.sim.summary import summarize
from dsi.sim.validate_serve import Layout, Measured, measure
from dsi.sim.validate_slice import SliceConfig, build_slice

TTFT_BOUND = 0.25  # the goal: simulated TTFT p50 within 25 % of the measured one


@dataclass(slots=True, frozen=True)
class Figures:
    """One side. ``requests`` that produced a first token, ``errors`` that did not; seconds."""

    requests: int
    errors: int
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    hit_rate: float
    tbt_p50_s: float | None = None  # per-request mean gap between tokens


def _quantiles(ttft_s: Sequence[float]) -> tuple[float | None, float | None]:
    if not ttft_s:
        return None, None
    p50, p90 = np.percentile(np.asarray(ttft_s, dtype=float), [50, 90])
    return round(float(p50), 4), round(float(p90), 4)


def measured_figures(results: Sequence[Measured]) -> Figures:
    ok = [m for m in results if m.error is None and m.ttft_s is not None]
    prompt = sum(m.prompt_tokens for m in ok)
    p50, p90 = _quantiles([m.ttft_s for m in ok if m.ttft_s is not None])
    hit = round(sum(m.cached_tokens for m in ok) / prompt, 4) if prompt else 0.0
    tbt = [m.tbt_s for m in ok if m.tbt_s is not None]
    tbt_p50 = round(float(np.percentile(tbt, 50)), 4) if tbt else None
    return Figures(len(ok), len(results) - len(ok), p50, p90, hit, tbt_p50)


def simulated_figures(summary: Mapping) -> Figures:
    """From :func:`dsi.sim.summary.summarize`'s dict."""
    ttft = summary["ttft_s"]
    tbt = summary["tbt_s"]["p50"]
    return Figures(
        summary["workload"]["requests"],
        0,
        ttft["p50"],
        ttft["p90"],
        summary["hit_rate"],
        None if tbt is None else round(tbt, 4),
    )


@dataclass(slots=True, frozen=True)
class Comparison:
    measured: Figures
    simulated: Figures
    bound: float = TTFT_BOUND

    @property
    def ttft_p50_error(self) -> float | None:
        """(simulated - measured) / measured TTFT p50; None when a side has none."""
        m, s = self.measured.ttft_p50_s, self.simulated.ttft_p50_s
        if m is None or s is None or m <= 0:
            return None
        return round((s - m) / m, 4)

    @property
    def hit_rate_diff(self) -> float:
        """Simulated - measured hit rate (a difference of shares, not a relative error)."""
        return round(self.simulated.hit_rate - self.measured.hit_rate, 4)

    @property
    def within_bound(self) -> bool:
        err = self.ttft_p50_error
        return err is not None and abs(err) <= self.bound

    def describe(self) -> dict:
        return {
            "measured": asdict(self.measured),
            "simulated": asdict(self.simulated),
            "ttft_p50_rel_error": self.ttft_p50_error,
            "hit_rate_diff": self.hit_rate_diff,
            "bound": self.bound,
            "within_bound": self.within_bound,
        }


def text(result: Mapping) -> str:
    """The side-by-side table of :func:`validate`'s result."""
    c, w = result["comparison"], result["workload"]
    m, s = c["measured"], c["simulated"]

    def cell(v: object) -> str:
        return "-" if v is None else f"{v}"

    err = c["ttft_p50_rel_error"]
    lines = [
        f"{w['requests']} requests ({w['prompt_tokens']:,} prompt / {w['output_tokens']:,} output tokens) "
        f"over {w['span_s']:g} s, trace time / {w['time_scale']:g}; "
        f"{result['layout']['prefills']} prefill + {result['layout']['decodes']} decode, profile cpu",
        f"{'':<14}{'measured':>12}{'simulated':>12}",
        f"{'TTFT p50 s':<14}{cell(m['ttft_p50_s']):>12}{cell(s['ttft_p50_s']):>12}",
        f"{'TTFT p90 s':<14}{cell(m['ttft_p90_s']):>12}{cell(s['ttft_p90_s']):>12}",
        f"{'TBT p50 s':<14}{cell(m['tbt_p50_s']):>12}{cell(s['tbt_p50_s']):>12}",
        f"{'hit rate':<14}{m['hit_rate']:>12}{s['hit_rate']:>12}",
        f"{'failed':<14}{m['errors']:>12}{s['errors']:>12}",
        f"TTFT p50 error {'-' if err is None else f'{err:+.1%}'} (goal within {c['bound']:.0%}: "
        f"{'met' if c['within_bound'] else 'not met'}); hit rate difference {c['hit_rate_diff']:+.4f}",
    ]
    return "\n".join(lines)


def engine_threads(config: Path) -> int:
    """The torch threads ``config`` gives each engine process (0: torch's default)."""
    return load_config(config).engine.threads


def sim_config(
    layout: Layout, config: Path, cores: int | None = None, path: RequestPath | None = None
) -> SimConfig:
    """The served cluster as the simulator builds it (arrivals are already scaled; the decode
    reserves between two steps, as dsi's engine does; a prefill batches what waits up to its
    ``max_batch_tokens``): every engine instance on this host's ``cores`` (default: the CPUs
    this process may use), each computing with ``[engine] threads`` (0: one per core, as torch
    gives the bench that measured the profile); ``path``: what the probes measured outside the
    instances."""
    node = load_config(config)
    cores = cores or len(os.sched_getaffinity(0))
    path = path or RequestPath()
    budgets = [r.options.max_batch_tokens for r in node.roles if r.kind == "prefill"]
    return SimConfig(
        prefills=layout.prefills,
        decodes=layout.decodes,
        hit_policy=node.kvcache.hit_policy,
        reserve_at_step=True,
        prefill_batch_tokens=min(budgets) if budgets else 0,
        path_s=path.fixed_s,
        path_s_per_token=path.per_token_s,
        shared_cores=cores,
        engine_threads=node.engine.threads or cores,
    )


@dataclass(slots=True, frozen=True)
class RequestPath:
    """What a request's way outside the instances adds to its TTFT: ``fixed_s`` + ``per_token_s``
    * prompt tokens (gateway rendering and tokenizing, routing, the calls between roles, the
    store's lookups and puts, the first chunk back), seconds."""

    fixed_s: float = 0.0
    per_token_s: float = 0.0


def request_path(profile: HardwareProfile, probes: Sequence[Measured]) -> RequestPath:
    """From ``probes`` (requests sent alone to an idle cluster, short and long ones): per probe,
    TTFT less the cost model's prefill forward and handoff of its prompt; the line through the
    median of the shorter half and the median of the longer half (one length: a constant).
    Neither term is below 0."""
    cost = CostModel.of(profile)
    points = sorted(
        (m.prompt_tokens, m.ttft_s - cost.prefill_s(m.prompt_tokens, 0) - cost.handoff_s(m.prompt_tokens))
        for m in probes
        if m.ttft_s is not None and m.prompt_tokens > 0
    )
    if not points:
        return RequestPath()
    half = len(points) // 2
    if points[0][0] == points[-1][0] or half == 0:
        return RequestPath(round(max(0.0, statistics.median(p[1] for p in points)), 4))
    short, long = points[:half], points[half:]
    x0, y0 = statistics.median(p[0] for p in short), statistics.median(p[1] for p in short)
    x1, y1 = statistics.median(p[0] for p in long), statistics.median(p[1] for p in long)
    slope = max(0.0, (y1 - y0) / (x1 - x0)) if x1 > x0 else 0.0
    return RequestPath(round(max(0.0, y0 - slope * x0), 4), round(slope, 9))


def validate(bench: Mapping[str, object], slice_cfg: SliceConfig, config: Path | None = None) -> dict:
    """Measure, simulate and compare on ``config`` (default dsi's configs/local.toml); ``bench``:
    the object ``dsi bench engine --json`` prints."""
    config = config or paths.config("local.toml")
    profile = cpu_profile(bench)
    model = load_config(config).model.name
    part = build_slice(slice_cfg, model)
    served = measure(part.requests, config)
    layout, results = served.layout, served.results
    path = request_path(profile, served.probes)
    cfg = sim_config(layout, config, path=path)
    cluster = Cluster(cfg, profile, [r.sim for r in part.requests]).run()
    summary = summarize(cluster)
    comparison = Comparison(measured_figures(results), simulated_figures(summary))
    mismatched = sum(
        1
        for r, m in zip(part.requests, results, strict=True)
        if m.error is None and m.prompt_tokens != r.sim.prompt_tokens
    )
    return {
        "workload": part.describe(),
        "layout": asdict(layout),
        "profile": {
            "prefill_tok_s": bench.get("prefill_tok_s"),
            "path_s": path.fixed_s,
            "path_s_per_token": path.per_token_s,
            "prefill_batch_tokens": cfg.prefill_batch_tokens,
            "probe_ttft_s": [m.ttft_s and round(m.ttft_s, 4) for m in served.probes],
            "prefill_fixed_s": profile.prefill_fixed_s,
            "decode_step": asdict(profile.decode),
            "shared_cores": cfg.shared_cores,
            "engine_threads": cfg.engine_threads,
        },
        "comparison": comparison.describe(),
        "prompt_tokens_mismatched": mismatched,
        "client_late_s_max": round(max((m.late_s for m in results), default=0.0), 4),
        "errors": sorted({m.error for m in results if m.error})[:5],
        "per_request": [
            {
                "arrival_s": round(r.sim.arrival_s, 3),
                "prompt_tokens": r.sim.prompt_tokens,
                "measured_ttft_s": None if m.ttft_s is None else round(m.ttft_s, 4),
                "simulated_ttft_s": round(float(sim_ttft), 4),
                "measured_cached": m.cached_tokens,
                "simulated_cached": int(sim_hit),
            }
            for r, m, sim_ttft, sim_hit in zip(
                part.requests, results, cluster.rec.ttft_s, cluster.rec.hit, strict=True
            )
        ],
    }
