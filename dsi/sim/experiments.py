"""The studies of issue 26, one command each: ``dsi sim experiment NAME``.

    a  ttl         chatbot sessions over 14 days: store TTL 3 vs 7 days (vs 30)
    b  prefill-lb  length buckets vs least-loaded vs round-robin, on mixed lengths and on the
                   Mooncake conversation trace
    c  decode-lb   long/short bands vs least-loaded vs round-robin
    d  autoscale   a diurnal day: autoscaled prefill and decode vs fixed P:D
    e  cache       one global store vs per-instance caches vs prefix-affinity routing
    f  replay      bounded replay (and what the store keeps) on vs off: prefill compute

Each returns ``{"experiment", "letter", "title", "command", "workload", "variants": [{"name",
"summary"}]}``; ``quick`` makes every workload small (tests). Variants of one experiment run
the same requests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dsi import paths
from dsi.autoscale import AutoscalerConfig, RoleBounds
from dsi.sim.config import DAY_S, SimConfig
from dsi.sim.generators import GeneratorConfig, generate
from dsi.sim.profiles import get_profile
from dsi.sim.run import simulate
from dsi.sim.trace import trace_workload
from dsi.sim.workload import SimRequest

Variants = list[tuple[str, list[SimRequest], SimConfig]]


@dataclass(slots=True, frozen=True)
class Experiment:
    name: str
    letter: str
    title: str
    build: Callable[[bool], tuple[str, Variants]]  # quick -> (workload described, variants)


def _trace(quick: bool, scale: float) -> tuple[str, list[SimRequest]]:
    limit = 1500 if quick else 0
    requests = trace_workload(paths.trace(), limit)
    text = f"Mooncake conversation trace ({len(requests):,} requests), arrivals x{scale:g}"
    return text, requests


def _ttl(quick: bool) -> tuple[str, Variants]:
    gen = GeneratorConfig(
        kind="chat", rate=0.004 if not quick else 0.01, hours=(3 if quick else 14) * 24, seed=1
    )
    requests = generate(gen)
    base = SimConfig(prefills=1, decodes=1, persist="all", sample_s=3600.0)
    variants = [
        (f"TTL {days} d", requests, dataclasses.replace(base, chatbot_ttl_s=days * DAY_S))
        for days in (3, 7, 30)
    ]
    variants.append(("TTL 7 d, dsi's persist rule", requests, dataclasses.replace(base, persist="hit-free")))
    return f"chat sessions: {gen} -> {len(requests):,} requests", variants


def _prefill_lb(quick: bool) -> tuple[str, Variants]:
    out: Variants = []
    texts = []
    for rate in (40.0, 80.0, 120.0):  # about 30, 60 and 90 % of 4 prefill instances
        gen = GeneratorConfig(
            kind="poisson",
            rate=rate,
            hours=0.005 if quick else 0.04,
            message_tokens=2000,
            message_sigma=1.6,
            seed=2,
        )
        mixed = generate(gen)
        texts.append(f"{rate:g}/s: {len(mixed):,}")
        for lb in ("bucketed", "least-loaded", "round-robin"):
            cfg = SimConfig(prefills=4, decodes=8, persist="all", prefill_lb=lb)
            out.append((f"mixed {rate:g}/s, {lb}", mixed, cfg))
    text, trace = _trace(quick, 40.0)
    for lb in ("bucketed", "least-loaded", "round-robin"):
        cfg = SimConfig(prefills=4, decodes=8, persist="all", prefill_lb=lb, time_scale=40.0)
        out.append((f"trace x40, {lb}", trace, cfg))
    mixed_text = (
        "mixed: single-turn requests, message log-normal (median 2,000 tokens, sigma 1.6) after a "
        f"2,048-token system prompt, Poisson arrivals ({', '.join(texts)} requests)"
    )
    return f"{mixed_text}; trace: {text}; 4 prefill and 8 decode instances", out


def _decode_lb(quick: bool) -> tuple[str, Variants]:
    text, trace = _trace(quick, 40.0)
    return f"{text}; 8 prefill and 4 decode instances", [
        (lb, trace, SimConfig(prefills=8, decodes=4, persist="all", decode_lb=lb, time_scale=40.0))
        for lb in ("bands", "least-loaded", "round-robin")
    ]


def _scaled(pool: int) -> AutoscalerConfig:
    return AutoscalerConfig(
        prefill=RoleBounds(min_instances=1, max_instances=8, max_change=2, margin=0.2, ready_pool=pool),
        decode=RoleBounds(min_instances=1, max_instances=16, max_change=2, margin=0.2, ready_pool=pool),
        interval_s=30.0,
    )


def _autoscale(quick: bool) -> tuple[str, Variants]:
    hours = 0.25 if quick else 2.0
    rate = 2.0 if quick else 6.0
    day = GeneratorConfig(
        kind="diurnal", rate=rate, hours=hours, period_s=hours * 3600, output_tokens=2000, seed=3
    )
    burst = GeneratorConfig(kind="bursty", rate=rate, hours=hours / 2, output_tokens=2000, seed=4)
    smooth, bursty = generate(day), generate(burst)
    base = SimConfig(persist="all", slo_tbt_s=0.025, sample_s=30.0)
    variants: Variants = [
        ("day: fixed 1P:5D (peak)", smooth, dataclasses.replace(base, prefills=1, decodes=5)),
        ("day: fixed 1P:3D (mean)", smooth, dataclasses.replace(base, prefills=1, decodes=3)),
        ("day: autoscaled, no ready pool", smooth, dataclasses.replace(base, scaling=_scaled(0))),
        ("day: autoscaled, ready pool 1", smooth, dataclasses.replace(base, scaling=_scaled(1))),
        ("bursts: fixed 1P:5D", bursty, dataclasses.replace(base, prefills=1, decodes=5)),
        ("bursts: autoscaled, no ready pool", bursty, dataclasses.replace(base, scaling=_scaled(0))),
        ("bursts: autoscaled, ready pool 1", bursty, dataclasses.replace(base, scaling=_scaled(1))),
    ]
    text = (
        f"day: one diurnal day (peak/trough 4) compressed into {hours:g} h, {rate:g} requests/s on average, "
        f"answers of median 2,000 tokens -> {len(smooth):,} requests; bursts: {rate:g} requests/s on "
        f"average in bursts of 8x for ~60 s every ~10 min, {hours / 2:g} h -> {len(bursty):,} requests; "
        "TBT SLO 25 ms (200 requests per decode instance)"
    )
    return text, variants


def _cache(quick: bool) -> tuple[str, Variants]:
    text, trace = _trace(quick, 10.0)
    distinct = len(np.unique(np.concatenate([r.keys for r in trace]).view("V16")))
    out: Variants = []
    for label, total in (("unbounded", 0), ("10% of distinct pages", max(8, distinct // 10))):
        for cache in ("global", "local", "affinity"):
            pages = total if cache == "global" else total // 8
            cfg = SimConfig(
                prefills=8, decodes=8, persist="all", cache=cache, cache_pages=pages, time_scale=10.0
            )
            out.append((f"{cache}, {label}", trace, cfg))
    return f"{text}; {distinct:,} distinct pages; 8 prefill instances", out


def _replay(quick: bool) -> tuple[str, Variants]:
    text, trace = _trace(quick, 10.0)
    base = SimConfig(prefills=4, decodes=8, time_scale=10.0)
    return text, [
        ("bounded replay, every request persists", trace, dataclasses.replace(base, persist="all")),
        ("bounded replay, dsi's persist rule", trace, base),
        ("no encoder-side replay (exact hits only)", trace, dataclasses.replace(base, hit_policy="exact")),
        (
            "no decoder-side replay (keep off)",
            trace,
            dataclasses.replace(base, persist="all", decoder_replay=False),
        ),
    ]


EXPERIMENTS = {
    e.name: e
    for e in (
        Experiment("ttl", "a", "TTL 3 vs 7 days on chatbot traffic", _ttl),
        Experiment("prefill-lb", "b", "prefill: length buckets vs least-loaded vs round-robin", _prefill_lb),
        Experiment("decode-lb", "c", "decode: long/short bands vs least-loaded vs round-robin", _decode_lb),
        Experiment("autoscale", "d", "autoscaled PD vs a fixed P:D ratio", _autoscale),
        Experiment("cache", "e", "global store vs per-instance caches vs prefix-affinity routing", _cache),
        Experiment("replay", "f", "bounded replay on vs off: prefill compute", _replay),
    )
}


def run_experiment(name: str, quick: bool = False, profile: str = "h800") -> dict:
    """Every variant of experiment ``name`` on ``profile``."""
    try:
        experiment = EXPERIMENTS[name]
    except KeyError:
        raise ValueError(f"unknown experiment {name!r}; choose from {', '.join(EXPERIMENTS)}") from None
    hardware = get_profile(profile)
    workload, variants = experiment.build(quick)
    return {
        "experiment": name,
        "letter": experiment.letter,
        "title": experiment.title,
        "command": f"dsi sim experiment {name}"
        + (" --quick" if quick else "")
        + (f" --profile {profile}" if profile != "h800" else ""),
        "profile": profile,
        "workload": workload,
        "variants": [
            {"name": label, "summary": simulate(reqs, cfg, hardware)} for label, reqs, cfg in variants
        ],
    }
