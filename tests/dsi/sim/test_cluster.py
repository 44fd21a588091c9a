"""The event loop on dsi's policies: outcomes the issue asks the simulator to show, on small
workloads (each test runs in a few seconds)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from dsi import paths
from dsi.autoscale import AutoscalerConfig, RoleBounds
from dsi.sim import GeneratorConfig, SimConfig, generate, get_profile, simulate, trace_workload
from dsi.sim.config import DAY_S
from dsi.sim.workload import SimRequest

H800 = get_profile("h800")


@pytest.fixture(scope="module")
def trace():
    return trace_workload(paths.trace(), limit=1200)


def test_a_seed_gives_the_same_summary_twice():
    reqs = generate(GeneratorConfig(kind="chat", rate=0.2, hours=0.5, seed=9))
    cfg = SimConfig(
        scaling=AutoscalerConfig(
            prefill=RoleBounds(min_instances=1, max_instances=3, ready_pool=1),
            decode=RoleBounds(min_instances=1, max_instances=3, ready_pool=1),
        ),
        time_scale=20.0,
    )
    one = json.dumps(simulate(reqs, cfg, H800))
    two = json.dumps(simulate(generate(GeneratorConfig(kind="chat", rate=0.2, hours=0.5, seed=9)), cfg, H800))
    assert one == two


def test_every_request_is_served_once_with_its_tokens(trace):
    s = simulate(trace, SimConfig(prefills=2, decodes=2), H800)
    assert s["workload"]["requests"] == 1200 and s["workload"]["end_s"] >= s["workload"]["span_s"]
    assert s["ttft_s"]["p50"] > 0 and s["tbt_s"]["p50"] >= H800.decode.fixed_s
    assert 0 < s["hit_rate"] < 1 and s["prefill"]["uncached_tokens"] < s["workload"]["prompt_tokens"]


def test_a_global_store_hits_more_than_local_caches_on_cross_session_reuse(trace):
    base = SimConfig(prefills=8, decodes=4, persist="all", prefill_lb="least-loaded", time_scale=10.0)
    hit = {
        c: simulate(trace, dataclasses.replace(base, cache=c), H800)["hit_rate"]
        for c in ("global", "local", "affinity")
    }
    assert hit["global"] > 1.5 * hit["local"]
    assert hit["affinity"] > hit["local"]


def test_a_seven_day_ttl_keeps_more_of_the_returns_than_three_days():
    reqs = generate(GeneratorConfig(kind="chat", rate=0.0005, hours=9 * 24, seed=2))
    base = SimConfig(prefills=1, decodes=1, persist="all", sample_s=3600.0)
    three = simulate(reqs, dataclasses.replace(base, chatbot_ttl_s=3 * DAY_S), H800)
    seven = simulate(reqs, base, H800)
    assert seven["hit_rate"] > three["hit_rate"]
    assert seven["store_pages_mean"] > three["store_pages_mean"]  # what the longer TTL costs


def test_length_buckets_cut_the_ttft_tail_of_round_robin_on_mixed_lengths():
    gen = GeneratorConfig(
        kind="poisson", rate=40.0, hours=0.02, message_tokens=2000, message_sigma=1.6, seed=2
    )
    reqs = generate(gen)
    p99 = {
        lb: simulate(reqs, SimConfig(prefills=4, decodes=8, persist="all", prefill_lb=lb), H800)["ttft_s"][
            "p99"
        ]
        for lb in ("bucketed", "round-robin")
    }
    assert p99["bucketed"] < p99["round-robin"]


def test_replay_variants_order_prefill_compute(trace):
    base = SimConfig(prefills=4, decodes=4, persist="all", time_scale=10.0)
    on = simulate(trace, base, H800)
    off = simulate(trace, dataclasses.replace(base, decoder_replay=False), H800)
    exact = simulate(trace, dataclasses.replace(base, hit_policy="exact"), H800)
    assert off["prefill"]["pflops"] > 1.8 * on["prefill"]["pflops"]
    assert exact["prefill"]["bounded_hits"] == 0 and exact["hit_rate"] < on["hit_rate"]


def test_the_autoscaler_holds_fewer_idle_instance_hours_than_a_cluster_sized_for_the_peak():
    day = GeneratorConfig(kind="diurnal", rate=2.0, hours=0.25, period_s=900.0, output_tokens=2000, seed=3)
    reqs = generate(day)
    base = SimConfig(persist="all", slo_tbt_s=0.025, sample_s=30.0)
    scaling = AutoscalerConfig(
        prefill=RoleBounds(min_instances=1, max_instances=4, max_change=2),
        decode=RoleBounds(min_instances=1, max_instances=8, max_change=2),
        interval_s=30.0,
    )
    fixed = simulate(reqs, dataclasses.replace(base, prefills=1, decodes=4), H800)
    scaled = simulate(reqs, dataclasses.replace(base, scaling=scaling), H800)
    assert scaled["instances"]["decode"]["idle_hours"] < fixed["instances"]["decode"]["idle_hours"]
    assert scaled["scaling_moves"]["decode start"] > 0
    serving = [c[0] for c in scaled["series"]["decode"]]
    assert min(serving) == 1 and max(serving) > 1


def test_requests_that_fit_no_decode_are_refused_up_front(trace):
    tiny = dataclasses.replace(H800, decode_kv_tokens=1_000)
    with pytest.raises(ValueError, match="do not fit one decode instance"):
        simulate(trace, SimConfig(), tiny)


def test_a_decode_that_reserves_between_steps_delays_the_first_token():
    """Two requests to one decode: the second is reserved at the end of the first one's step in
    progress, so its TTFT grows by at most one decode step (and never shrinks)."""
    keys = np.zeros((0, 2), dtype=np.uint64)
    reqs = [SimRequest(i, 0.5 * i, 64, 200, keys, keys) for i in range(2)]
    cpu = get_profile("cpu")
    at_once = simulate(reqs, SimConfig(prefills=1, decodes=1), cpu)
    between = simulate(reqs, SimConfig(prefills=1, decodes=1, reserve_at_step=True), cpu)
    step = cpu.decode.step_s(1, 64)
    assert between["ttft_s"]["p50"] >= at_once["ttft_s"]["p50"]
    delay = 2 * (between["ttft_s"]["mean"] - at_once["ttft_s"]["mean"])  # the second request's
    assert 0 < delay <= step + 1e-6
