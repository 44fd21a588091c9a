"""An experiment's result as a Markdown table: one row per variant, the columns that answer
its question."""

from __future__ import annotations

from collections.abc import Callable

Column = tuple[str, Callable[[dict], object]]


def _share(s: dict, role: str) -> float:
    hours = s["instances"][role]
    return hours["busy_hours"] / hours["instance_hours"] if hours["instance_hours"] else 0.0


def _late_hit_rate(s: dict) -> float | None:
    days = s["hit_rate_by_day"]
    return round(sum(days[7:]) / len(days[7:]), 4) if len(days) > 7 else None


COMMON: list[Column] = [
    ("TTFT p50 s", lambda s: s["ttft_s"]["p50"]),
    ("TTFT p99 s", lambda s: s["ttft_s"]["p99"]),
    ("TBT p99 ms", lambda s: round(s["tbt_s"]["p99"] * 1e3, 2) if s["tbt_s"]["p99"] is not None else None),
    ("SLO met", lambda s: s["slo"]["attainment"]),
]
COLUMNS: dict[str, list[Column]] = {
    "ttl": [
        ("hit rate", lambda s: s["hit_rate"]),
        ("hit rate, days 8+", _late_hit_rate),
        ("store pages, mean", lambda s: f"{s['store_pages_mean']:,.0f}"),
        ("store pages, end", lambda s: f"{s['store_pages_end']:,}"),
        ("prefill PFLOP", lambda s: s["prefill"]["pflops"]),
    ],
    "prefill-lb": [
        ("TTFT p50 s", lambda s: s["ttft_s"]["p50"]),
        ("TTFT p99 s", lambda s: s["ttft_s"]["p99"]),
        (
            "TTFT p99 by bucket s",
            lambda s: " / ".join(
                "-" if v is None else f"{v:g}" for v in s["prefill"]["ttft_p99_by_bucket_s"]
            ),
        ),
        ("TTFT SLO met", lambda s: s["slo"]["ttft_attainment"]),
        ("prefill busy", lambda s: round(_share(s, "prefill"), 3)),
    ],
    "decode-lb": [
        ("TBT p50 ms", lambda s: round(s["tbt_s"]["p50"] * 1e3, 2)),
        ("TBT p99 ms", lambda s: round(s["tbt_s"]["p99"] * 1e3, 2)),
        ("TTFT p99 s", lambda s: s["ttft_s"]["p99"]),
        ("waited for a decode", lambda s: s["waited_requests"]),
        ("SLO met", lambda s: s["slo"]["attainment"]),
    ],
    "autoscale": [
        ("prefill inst-h", lambda s: s["instances"]["prefill"]["instance_hours"]),
        ("prefill idle h", lambda s: s["instances"]["prefill"]["idle_hours"]),
        ("decode inst-h", lambda s: s["instances"]["decode"]["instance_hours"]),
        ("decode idle h", lambda s: s["instances"]["decode"]["idle_hours"]),
        *COMMON,
        ("waited for a decode", lambda s: s["waited_requests"]),
    ],
    "cache": [
        ("hit rate", lambda s: s["hit_rate"]),
        ("un-cached Mtok", lambda s: round(s["prefill"]["uncached_tokens"] / 1e6, 1)),
        ("prefill PFLOP", lambda s: s["prefill"]["pflops"]),
        ("TTFT p50 s", lambda s: s["ttft_s"]["p50"]),
        ("TTFT p99 s", lambda s: s["ttft_s"]["p99"]),
        ("prefill busy max/mean", lambda s: s["prefill"]["busy_max_over_mean"]),
    ],
    "replay": [
        ("hit rate", lambda s: s["hit_rate"]),
        (
            "exact / bounded hits",
            lambda s: f"{s['prefill']['exact_hits']:,} / {s['prefill']['bounded_hits']:,}",
        ),
        ("un-cached Mtok", lambda s: round(s["prefill"]["uncached_tokens"] / 1e6, 1)),
        ("prefill PFLOP", lambda s: s["prefill"]["pflops"]),
        ("TTFT p50 s", lambda s: s["ttft_s"]["p50"]),
        ("TTFT p99 s", lambda s: s["ttft_s"]["p99"]),
    ],
}


def table(result: dict) -> str:
    """The Markdown table of an experiment's result."""
    columns = COLUMNS.get(result["experiment"], COMMON)
    head = ["variant", *(name for name, _ in columns)]
    rows = [[v["name"], *(_cell(get(v["summary"])) for _, get in columns)] for v in result["variants"]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
