"""One /metrics text from the texts of an entrypoint's HTTP workers (Prometheus text format).

Every worker renders its own metrics (dsi.roles.entrypoint.metrics); the one that answers a
scrape merges them, series by series (a series: name and labels)::

    counter, histogram (every _bucket, _sum, _count)   summed: each worker counts its own requests
    gauge                                              the largest: most gauges are the cluster as
                                                       one worker sees it (replica blocks, route
                                                       table age, balancer buckets), alike in all
    exceptions (_RULES)                                dsi_requests_in_flight summed (per worker);
                                                       dsi_kv_replica_synced the smallest (1 only
                                                       when every replica is); the controller's
                                                       dsi_instance_transitions_total, copied into
                                                       every worker, the largest (the freshest copy)

Families keep the order of their first appearance, series too. A worker that did not answer
is missing from the sums; ``dsi_http_workers`` / ``dsi_http_workers_answered`` say so.

Example, two workers::

    # TYPE dsi_requests_total counter            # TYPE dsi_requests_total counter
    dsi_requests_total{protocol="chat",status="200"} 3  ...{protocol="chat",status="200"} 4
    -> dsi_requests_total{protocol="chat",status="200"} 7
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence

_RULES: dict[str, Callable[[float, float], float]] = {
    "dsi_requests_in_flight": operator.add,
    "dsi_kv_replica_synced": min,
    "dsi_instance_transitions_total": max,
}
_BY_TYPE: dict[str, Callable[[float, float], float]] = {
    "counter": operator.add,
    "histogram": operator.add,
    "gauge": max,
}
_HISTOGRAM_PARTS = ("_bucket", "_sum", "_count")


def merge_metrics(texts: Sequence[str], workers: int) -> str:
    """The texts of the ``len(texts)`` workers that answered (of ``workers``) as one text."""
    types: dict[str, str] = {}
    families: dict[str, dict[str, float]] = {}  # family -> series -> merged value
    for text in texts:
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split(" ", 3)
                types.setdefault(name, kind)
                families.setdefault(name, {})
            elif line and not line.startswith("#"):
                series, _, raw = line.rpartition(" ")
                family = _family(series, types)
                combine = _RULES.get(family) or _BY_TYPE.get(types.get(family, ""), max)
                values = families.setdefault(family, {})
                value = float(raw)
                values[series] = combine(values[series], value) if series in values else value
    out = [
        "# TYPE dsi_http_workers gauge",
        f"dsi_http_workers {workers}",
        "# TYPE dsi_http_workers_answered gauge",
        f"dsi_http_workers_answered {len(texts)}",
    ]
    for family, values in families.items():
        if family in types:
            out.append(f"# TYPE {family} {types[family]}")
        out += [f"{series} {_number(value)}" for series, value in values.items()]
    return "\n".join(out) + "\n"


def _family(series: str, types: dict[str, str]) -> str:
    """The metric family a series belongs to: its name, less a histogram's part suffix."""
    name = series.split("{", 1)[0]
    for part in _HISTOGRAM_PARTS:
        base = name.removesuffix(part)
        if base != name and types.get(base) == "histogram":
            return base
    return name


def _number(value: float) -> str:
    """Integers as integers (counts stay exact and readable), other values as Python writes them."""
    return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)
