"""`dsi sim validate` end to end: a private `dsi serve` of configs/local.toml gets a few requests of
the trace, the simulator the same ones, and the result reports both sides. The error bound is
not checked: a shared machine's timings are noise at this size."""

from __future__ import annotations

import json

import pytest

from dsi.cli.main import main
from dsi.sim.profiles import CPU_BENCH

pytestmark = [pytest.mark.slow, pytest.mark.concurrent]


def test_a_small_validation_reports_measured_and_simulated_sides(capsys, tmp_path):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(CPU_BENCH))
    argv = ["sim", "validate", "--requests", "4", "--rate", "4", "--max-output-tokens", "2"]
    assert main([*argv, "--max-prompt-tokens", "512", "--bench-json", str(bench), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    c = result["comparison"]
    assert result["workload"]["requests"] == 4
    assert c["measured"]["requests"] == 4 and c["measured"]["errors"] == 0
    assert c["simulated"]["requests"] == 4
    for side in ("measured", "simulated"):
        assert c[side]["ttft_p50_s"] > 0 and 0.0 <= c[side]["hit_rate"] < 1.0
    assert isinstance(c["ttft_p50_rel_error"], float)
    assert result["prompt_tokens_mismatched"] == 0  # the simulator saw the gateway's token ids
    assert all(r["measured_ttft_s"] is not None for r in result["per_request"])
