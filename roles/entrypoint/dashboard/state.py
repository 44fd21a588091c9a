"""The dashboard's state: one JSON object built from what the gateway already holds.

    {"at": unix s, "worker": "entrypoint-0",          the HTTP worker that answered
     "controller": {"id", "age_s", "error"},          the table's age (s); error "" when answered
     "instances": [...], "transitions": [...],        as ``dsi status --json`` gives them, without
     "warnings": [...],                               the instances' control-plane addresses
     "autoscale": {...} | null,                       as ``dsi status --json`` (null: off)
     "balancers": [...],                              as ``dsi status --json``: the balancer this
                                                      gateway routes with, as it last fetched it
     "gateway": {"requests", "errors", "in_flight", "prompt_tokens", "generated_tokens",
                 "prefix": {"lookup_tokens", "hit_tokens", "hit_rate", "engine_cached_tokens"},
                 "ttft": summary, "tbt": summary},    since this worker started
     "history": [point, ...]}                         oldest first (see history.py)

    summary: {"count": n, "mean": s, "p50": s, "p95": s} (null values while the count is 0)

Nothing here asks anything: the table and the autoscaler's state come from a ClusterView
snapshot, the balancer's from the gateway's router, the rest from the gateway's metrics.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dsi.cli.scale_view import scale_json
from dsi.cli.status import table_json
from dsi.cli.status_balancers import balancers_json
from dsi.messages.balancer import BalancerState
from dsi.roles.entrypoint.dashboard.cluster import ClusterSnapshot
from dsi.roles.entrypoint.dashboard.history import histogram_quantile
from dsi.roles.entrypoint.metrics import Histogram, Metrics


def dashboard_state(
    cluster: ClusterSnapshot,
    balancers: list[BalancerState],
    metrics: Metrics,
    history: Iterable[dict[str, Any]],
    *,
    worker: str,
    now: float,
) -> dict[str, Any]:
    """The object above; ``now`` in unix seconds."""
    table = table_json(cluster.table) if cluster.table is not None else _no_table()
    for info in table["instances"]:
        # The page does not need them, and the page is as open as /metrics.
        info.pop("address", None)
    return {
        "at": now,
        "worker": worker,
        "controller": {"id": table.pop("controller"), "age_s": cluster.age_s, "error": cluster.error},
        **table,
        "autoscale": scale_json(cluster.scale) if cluster.scale is not None else None,
        "balancers": balancers_json(balancers),
        "gateway": gateway_json(metrics),
        "history": list(history),
    }


def gateway_json(m: Metrics) -> dict[str, Any]:
    looked = m.prefix_lookup_tokens
    return {
        "requests": sum(m.requests.values()),
        "errors": sum(m.errors.values()),
        "in_flight": m.in_flight,
        "prompt_tokens": m.prompt_tokens,
        "generated_tokens": m.generated_tokens,
        "prefix": {
            "lookup_tokens": looked,
            "hit_tokens": m.prefix_hit_tokens,
            "hit_rate": m.prefix_hit_tokens / looked if looked else None,
            "engine_cached_tokens": m.engine_cached_tokens,
        },
        "ttft": latency_summary(m.ttft),
        "tbt": latency_summary(m.itl),
    }


def latency_summary(h: Histogram) -> dict[str, Any]:
    return {
        "count": h.n,
        "mean": h.total / h.n if h.n else None,
        "p50": histogram_quantile(h.buckets, h.counts, 0.5),
        "p95": histogram_quantile(h.buckets, h.counts, 0.95),
    }


def _no_table() -> dict[str, Any]:
    return {"controller": "", "instances": [], "transitions": [], "warnings": []}
