"""A finished run as one JSON-ready dict: the figures of issue 26, rounded so that equal runs
print equal text.

    ttft_s, tbt_s        p50 / p90 / p99 / mean, seconds (TBT: per-request mean gap, see records)
    slo                  attainment: share of requests with TTFT <= slo_ttft_s, with TBT <=
                         slo_tbt_s (requests of one token count as meeting it), and both
    hit_rate             hit tokens the prefills took / prompt tokens (hit_rate_by_day: of the
                         requests that arrived on each day)
    predicted_hit_rate   hit tokens the entrypoint predicted / prompt tokens
    prefill              un-cached tokens, FLOPs, hits taken exact / by bounded replay, the
                         busiest instance's busy time over the mean's,
                         TTFT p50 / p99 per length bucket (by un-cached tokens)
    instances            per role: instance-hours held, busy, serving and idle (held - busy)
    series               instance counts (serving, ready, starting) per role over time,
                         store pages, requests held by decodes and waiting
"""

from __future__ import annotations

import numpy as np

from dsi.sim.cluster import Cluster
from dsi.sim.config import DAY_S
from dsi.sim.workload import span_s


def _pct(values: np.ndarray, digits: int = 4) -> dict[str, float | None]:
    values = values[~np.isnan(values)]
    if not values.size:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {
        k: round(float(v), digits)
        for k, v in (("p50", p50), ("p90", p90), ("p99", p99), ("mean", values.mean()))
    }


def _spread(busy: list[float]) -> float:
    """The busiest instance's busy seconds over the mean instance's (1.0: even)."""
    mean = sum(busy) / len(busy) if busy else 0.0
    return round(max(busy) / mean, 3) if mean > 0 else 1.0


def _by_day(arrival_s: np.ndarray, hit: np.ndarray, prompt: np.ndarray) -> list[float]:
    """Hit rate of the requests that arrived on each day of the run (one entry per started day)."""
    day = (arrival_s // DAY_S).astype(np.int64)
    hits = np.bincount(day, weights=hit)
    prompts = np.bincount(day, weights=prompt)
    return [round(float(h / p), 4) if p else 0.0 for h, p in zip(hits, prompts, strict=True)]


def summarize(cluster: Cluster) -> dict:
    cfg, rec = cluster.cfg, cluster.rec
    ttft, tbt = rec.ttft_s, rec.tbt_s
    prompt_tokens = int(rec.prompt.sum())
    ttft_ok = ttft <= cfg.slo_ttft_s
    tbt_ok = np.where(np.isnan(tbt), True, tbt <= cfg.slo_tbt_s)
    hits = rec.hit > 0
    buckets = cluster.edges.buckets
    return {
        "config": cluster.cfg.describe(),
        "profile": cluster.profile.name,
        "workload": {
            "requests": rec.n,
            "prompt_tokens": prompt_tokens,
            "output_tokens": int(rec.output.sum()),
            "span_s": round(span_s(cluster.requests) / cfg.time_scale, 3),
            "end_s": round(cluster.end_s, 3),
        },
        "ttft_s": _pct(ttft),
        "tbt_s": _pct(tbt, 5),
        "slo": {
            "ttft_s": cfg.slo_ttft_s,
            "tbt_s": cfg.slo_tbt_s,
            "ttft_attainment": round(float(ttft_ok.mean()), 4),
            "tbt_attainment": round(float(tbt_ok.mean()), 4),
            "attainment": round(float((ttft_ok & tbt_ok).mean()), 4),
        },
        "hit_rate": round(float(rec.hit.sum()) / max(prompt_tokens, 1), 4),
        "predicted_hit_rate": round(float(rec.predicted.sum()) / max(prompt_tokens, 1), 4),
        "prefill": {
            "uncached_tokens": int(rec.uncached.sum()),
            "pflops": round(float(rec.flops.sum()) / 1e15, 3),
            "exact_hits": int((hits & rec.exact).sum()),
            "bounded_hits": int((hits & ~rec.exact).sum()),
            "busy_max_over_mean": _spread([m.engine.busy_s for m in cluster.prefills.members]),
            "requests_by_bucket": np.bincount(rec.bucket, minlength=buckets).tolist(),
            "ttft_p50_by_bucket_s": [_pct(ttft[rec.bucket == b])["p50"] for b in range(buckets)],
            "ttft_p99_by_bucket_s": [_pct(ttft[rec.bucket == b])["p99"] for b in range(buckets)],
        },
        "hit_rate_by_day": _by_day(rec.arrival_s, rec.hit, rec.prompt),
        "waited_requests": int(rec.waited.sum()),
        "store_pages_end": cluster.caches.pages(),
        "store_pages_mean": round(float(np.mean(cluster.series["store_pages"])), 1)
        if cluster.series["t_s"]
        else 0.0,
        "instances": {
            "prefill": cluster.prefills.hours(cluster.end_s),
            "decode": cluster.decodes.hours(cluster.end_s),
        },
        "scaling_moves": dict(sorted(cluster.scaler.moves.items())) if cluster.scaler is not None else {},
        "series": cluster.series,
    }
