"""Tables: one row per variant, '-' where a figure does not exist."""

from __future__ import annotations

from dsi.sim.report import table


def test_a_missing_figure_is_a_dash():
    summary = {
        "hit_rate": 0.5,
        "hit_rate_by_day": [0.5],
        "store_pages_mean": 10.0,
        "store_pages_end": 12,
        "prefill": {"pflops": 1.5},
    }
    text = table({"experiment": "ttl", "variants": [{"name": "TTL 7 d", "summary": summary}]})
    assert text.splitlines()[2] == "| TTL 7 d | 0.5 | - | 10 | 12 | 1.5 |"
