"""dsi sim validate: the comparison of measured and simulated figures, and the slice's arrivals
and pages (no cluster runs here; tests/dsi/cli/test_sim_validate_cli.py runs one)."""

import numpy as np
import pytest

from dsi.sim.cost import CostModel
from dsi.sim.profiles import get_profile
from dsi.sim.validate import (
    Comparison,
    Figures,
    RequestPath,
    engine_threads,
    measured_figures,
    request_path,
    sim_config,
    simulated_figures,
    text,
)
from dsi.sim.validate_serve import Layout, Measured
from dsi.sim.validate_slice import SliceConfig, time_scale


def test_measured_figures_skip_failures_and_weigh_hits_by_tokens():
    results = [
        Measured(0.1, prompt_tokens=100, cached_tokens=0),
        Measured(0.3, prompt_tokens=300, cached_tokens=256, tbt_s=0.05),
        Measured(0.2, prompt_tokens=100, cached_tokens=0),
        Measured(None, error="HTTP 503: no decode"),
    ]
    f = measured_figures(results)
    assert (f.requests, f.errors) == (3, 1)
    assert f.ttft_p50_s == 0.2 and f.ttft_p90_s == pytest.approx(0.28)
    assert f.hit_rate == round(256 / 500, 4)
    assert f.tbt_p50_s == 0.05  # only requests of more than one token have a TBT


def test_no_successful_request_gives_no_ttft():
    f = measured_figures([Measured(None, error="x")])
    assert (f.requests, f.ttft_p50_s, f.hit_rate) == (0, None, 0.0)
    assert Comparison(f, Figures(1, 0, 0.1, 0.2, 0.0)).ttft_p50_error is None


def test_relative_error_is_signed_and_the_hit_rate_a_difference():
    measured = Figures(10, 0, 0.200, 0.5, 0.30)
    over = Comparison(measured, Figures(10, 0, 0.240, 0.6, 0.35))
    assert over.ttft_p50_error == 0.2 and over.within_bound
    assert over.hit_rate_diff == 0.05
    under = Comparison(measured, Figures(10, 0, 0.140, 0.6, 0.25))
    assert under.ttft_p50_error == -0.3 and not under.within_bound
    assert under.hit_rate_diff == -0.05
    assert under.describe()["within_bound"] is False


def test_simulated_figures_read_the_summary():
    summary = {
        "workload": {"requests": 7},
        "ttft_s": {"p50": 0.05, "p90": 0.09},
        "tbt_s": {"p50": 0.04},
        "hit_rate": 0.4,
    }
    assert simulated_figures(summary) == Figures(7, 0, 0.05, 0.09, 0.4, 0.04)


def test_text_prints_both_sides_and_the_error():
    c = Comparison(Figures(4, 1, 0.2, 0.4, 0.3), Figures(5, 0, 0.25, 0.5, 0.28))
    result = {
        "workload": {
            "requests": 5,
            "prompt_tokens": 5000,
            "output_tokens": 80,
            "span_s": 10.0,
            "time_scale": 2.0,
        },
        "layout": {"prefills": 2, "decodes": 2, "model": "dsi-tiny"},
        "comparison": c.describe(),
    }
    out = text(result)
    assert "TTFT p50 s" in out and "0.2" in out and "0.25" in out
    assert "+25.0%" in out and "met" in out and "-0.0200" in out


def test_time_scale_sets_the_mean_rate():
    stamps = [0.0, 10.0, 10.0, 40.0]  # 3 gaps over 40 trace seconds
    scale = time_scale(stamps, rate=0.5)  # 3 arrivals / (40 / scale) = 0.5 per second
    assert scale == pytest.approx(40 * 0.5 / 3)
    assert 3 / (stamps[-1] / scale) == pytest.approx(0.5)
    assert time_scale([5.0, 5.0], rate=2.0) == 1.0


def test_slice_config_refuses_a_single_request():
    with pytest.raises(ValueError):
        SliceConfig(requests=1)
    with pytest.raises(ValueError):
        SliceConfig(rate=0)


def test_measured_late_posts_do_not_change_figures():
    f = measured_figures([Measured(0.1, 10, 0, late_s=2.0), Measured(0.3, 10, 0)])
    assert f.ttft_p50_s == pytest.approx(float(np.percentile([0.1, 0.3], 50)))


def test_the_request_path_is_what_probes_take_beyond_the_cost_model():
    profile = get_profile("cpu")
    cost = CostModel.of(profile)

    def forward(n: int) -> float:
        return cost.prefill_s(n, 0) + cost.handoff_s(n)

    short = [Measured(forward(40) + d, prompt_tokens=40) for d in (0.02, 0.05, 0.03)]
    assert request_path(profile, short) == RequestPath(0.03, 0.0)  # one length: a constant
    long = [Measured(forward(1_040) + d, prompt_tokens=1_040) for d in (0.13, 0.14, 0.12)]
    path = request_path(profile, short + long)  # 0.03 at 40 tokens, 0.13 at 1,040
    assert path.per_token_s == pytest.approx(1e-4) and path.fixed_s == pytest.approx(0.026)
    assert request_path(profile, [Measured(forward(40) / 2, prompt_tokens=40)]) == RequestPath()
    assert request_path(profile, [Measured(None, error="x")]) == RequestPath()


def test_the_simulated_cluster_shares_the_hosts_cores_as_dsi_serve_does(tmp_path):
    from dsi import paths

    local = paths.config("local.toml")  # [engine] threads unset: one per core
    cfg = sim_config(Layout(2, 2, "m"), local, cores=2)
    assert (cfg.prefills, cfg.decodes, cfg.shared_cores, cfg.engine_threads) == (2, 2, 2, 2)
    assert cfg.reserve_at_step and cfg.prefill_batch_tokens == 8192  # the prefills' max_batch_tokens
    one_thread = tmp_path / "one.toml"
    one_thread.write_text(local.read_text().replace("[engine]\n", "[engine]\nthreads = 1\n", 1))
    assert sim_config(Layout(2, 2, "m"), one_thread, cores=2).engine_threads == 1
    assert (engine_threads(local), engine_threads(one_thread)) == (0, 1)  # the profile's threads too
