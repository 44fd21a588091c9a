"""``dsi bench decode-lb`` on tiny workloads: the step-time model and the structure and invariants
of the figures, never timing."""

from __future__ import annotations

import argparse
import json

import pytest

from dsi.bench import cli as bench_cli
from dsi.bench.decode_lb import StepTimeModel, workload
from dsi.bench.decode_lb import run as run_decode
from dsi.bench.decode_lb import simulate as simulate_decode
from dsi.model.config import FLASH

DECODE_POLICIES = ("bands (KV load)", "bands (step cost)", "round-robin", "least-requests")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dsi")
    bench_cli.register(parser.add_subparsers(dest="command", required=True))
    return parser


def test_step_time_model_of_the_flash_shape():
    m = StepTimeModel.of_shape(FLASH, 400e12, 3e12, 0.01)
    assert 50e-6 < m.per_request_s < 100e-6 and 0 < m.per_kv_token_s < 1e-9
    assert 100_000 < m.per_request_s / m.per_kv_token_s < 400_000  # the docstring's "~230K"
    assert m.step_s(2, 1_000) == pytest.approx(0.01 + 2 * m.per_request_s + 1_000 * m.per_kv_token_s)


def test_decode_bench_figures_and_invariants():
    out = run_decode(instances=3, long=2, short=12, arrival_s=0.5)
    assert out["simulated"] is True and list(out["policies"]) == list(DECODE_POLICIES)
    total = sum(r.output for r in workload(2, 12, (8_192, 131_072), 0.5, 0))
    for p in out["policies"].values():
        assert p["step_spread"] >= 1.0 and len(p["mean_step_ms"]) <= 3
        assert p["output_tokens_per_s"] * p["makespan_s"] == pytest.approx(total, rel=1e-3)
        assert 10.0 < p["tpot_ms_short_p50"] <= p["tpot_ms_short_p99"]  # at least the fixed 10 ms


def test_one_decode_instance_makes_every_policy_the_same():
    out = run_decode(instances=1, long=1, short=6, arrival_s=0.2)
    first, *rest = out["policies"].values()
    assert all(p == first for p in rest)


def test_every_decode_request_finishes_with_its_tokens():
    model = StepTimeModel(0.01, 1e-4, 1e-9)
    requests = workload(1, 5, (8_192, 16_384), 0.1, seed=3)
    out = simulate_decode(requests, 2, model, lambda r, loads: loads[r.id % 2].id, 256, 10**8)
    assert out["makespan_s"] >= max(r.output for r in requests) * 0.01


def test_decode_bench_cli_prints_json(capsys):
    args = _parser().parse_args(
        ["bench", "decode-lb", "--json", "--instances", "2", "--long", "1", "--short", "4"]
    )
    assert args.func(args) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["instances"] == 2 and set(figures["policies"]) == set(DECODE_POLICIES)
