"""The summary: SLO attainment, per-day hit rates, JSON-ready values."""

from __future__ import annotations

import json

from dsi.sim import GeneratorConfig, SimConfig, generate, get_profile, simulate


def test_summary_fields_are_json_and_consistent():
    reqs = generate(GeneratorConfig(kind="poisson", rate=2.0, hours=0.2, seed=1))
    s = simulate(reqs, SimConfig(prefills=1, decodes=1, slo_ttft_s=1e-6), get_profile("h800"))
    json.dumps(s)
    assert s["slo"]["ttft_attainment"] == 0.0 and s["slo"]["attainment"] == 0.0  # nothing that fast
    assert s["slo"]["tbt_attainment"] == 1.0
    assert len(s["hit_rate_by_day"]) == 1 and s["hit_rate_by_day"][0] == s["hit_rate"]
    assert sum(s["prefill"]["requests_by_bucket"]) == len(reqs)
    assert s["ttft_s"]["p50"] <= s["ttft_s"]["p90"] <= s["ttft_s"]["p99"]
    held = s["instances"]["decode"]
    assert held["used_hours"] <= held["busy_hours"] <= held["instance_hours"]
