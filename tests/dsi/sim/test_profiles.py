"""Hardware profiles: the derived figures of the GPU nodes, and the cpu profile from the
output of `dsi bench engine --json`."""

from __future__ import annotations

import json

import pytest

from dsi.model.config import FLASH, TINY
from dsi.sim.profiles import CPU_BENCH, cpu_profile, get_profile, weight_bytes


def test_gpu_nodes_follow_their_stated_assumptions():
    h800, h200 = get_profile("h800"), get_profile("h200")
    assert h800.model is FLASH and h800.prefill_flops_per_s == pytest.approx(8 * 1979e12 * 0.35)
    assert weight_bytes(FLASH) == pytest.approx(371.5e9, rel=1e-3)
    assert h800.decode.fixed_s == pytest.approx(371.55e9 / (8 * 3.35e12 * 0.7) + 0.003, rel=1e-3)
    assert h200.decode.fixed_s < h800.decode.fixed_s  # faster HBM, same compute
    assert h200.prefill_flops_per_s == h800.prefill_flops_per_s


def test_cpu_profile_fits_a_line_through_the_bench_decode_points(tmp_path):
    bench = {"default_scheduling": "async", "prefill_tok_s": 2048.0}
    for b in (1, 16, 64):  # step = 5 ms + 1 ms per request exactly
        bench[f"decode_tok_s_b{b}_async"] = b / (0.005 + 0.001 * b)
    p = cpu_profile(bench)
    assert p.model is TINY
    assert p.decode.fixed_s == pytest.approx(0.005) and p.decode.per_request_s == pytest.approx(0.001)
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    assert get_profile("cpu", path).decode == p.decode
    assert get_profile("cpu").prefill_flops_per_s > 0 and CPU_BENCH["prefill_tok_s"] > 0


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="not the output of"):
        cpu_profile({"prefill_tok_s": 1.0})
    with pytest.raises(ValueError, match="unknown hardware profile"):
        get_profile("tpu")
