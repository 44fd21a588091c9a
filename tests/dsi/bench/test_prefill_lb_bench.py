"""``dsi bench prefill-lb`` on tiny traces: the hit model, the FIFO engines, and the structure and
invariants of the figures, never timing."""

from __future__ import annotations

import argparse
import itertools
import json

import pytest

from dsi.bench import cli as bench_cli
from dsi.bench.prefill_lb import POLICIES, Job, simulate, uncached_tokens
from dsi.bench.prefill_lb import run as run_prefill
from dsi.bench.trace_hits import TraceRequest


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dsi")
    bench_cli.register(parser.add_subparsers(dest="command", required=True))
    return parser


def _trace(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _rows(n=60):
    rows = []
    for i in range(n):
        length = [3_000, 20_000, 70_000][i % 3] + 37 * i
        ids = [0, *range(1_000 * i + 1, 1_000 * i + 1 + length // 512)]
        rows.append({"timestamp": 500 * i, "input_length": length, "output_length": 10, "hash_ids": ids})
    return rows


def test_hit_model_takes_persisted_full_ids_only():
    a = TraceRequest(0.0, 1_100, (7, 8, 9))  # ids 7, 8 full; 9 partial (76 tokens): not persisted
    b = TraceRequest(0.5, 1_600, (7, 8, 20, 21))  # within the persist delay of a: no hit
    c = TraceRequest(2.0, 1_600, (7, 8, 9, 10))  # 7 and 8 are stored, 9 is not
    e = TraceRequest(4.0, 1_600, (7, 8, 9, 10))  # c persisted its full ids 7, 8, 9
    d = TraceRequest(5.0, 1_024, (7, 8))  # a 1,024-token prompt may use 896 tokens: 7 pages
    assert uncached_tokens([a, b, c, e, d]) == [(1_100, 0), (1_600, 0), (576, 1_024), (64, 1_536), (128, 896)]


def test_prefill_bench_figures_and_invariants(tmp_path):
    trace = _trace(tmp_path / "t.jsonl", _rows())
    out = run_prefill(trace, engines=3, utilization=0.6)
    assert out["requests"] == 60 and list(out["policies"]) == list(POLICIES)
    assert out["native_utilization"] * out["time_scale"] == pytest.approx(0.6, rel=1e-2)
    assert sum(out["requests_by_bucket"]) == 60 and out["requests_by_bucket"][3] == 0
    assert out["uncached_tokens"] <= out["prompt_tokens"]
    for p in out["policies"].values():
        assert 0 < p["ttft_p50_s"] <= p["ttft_p99_s"]
        assert p["load_max_over_mean"] >= 1.0
        assert p["ttft_p99_by_bucket_s"][3] is None  # no request of >= 256K
    bucketed = out["policies"]["bucketed"]
    assert sum(bucketed["final_engines_by_bucket"]) == 3 and bucketed["plan_changes"] >= 1


def test_one_engine_serves_first_come_first_served():
    spaced = [Job(0.1 * i, 1_000, 0, 1e12) for i in range(10)]  # 0.1 s each at 10 PFLOP/s, 0.1 s apart
    together = [Job(0.0, 1_000, 0, 1e12) for _ in range(10)]
    one = simulate(spaced, 1, 1e13, 1.0, lambda job, loads, now: loads[0].id, (16_384,))
    assert one["ttft_p50_s"] == one["ttft_p99_s"] == 0.1 and one["load_max_over_mean"] == 1.0
    queued = simulate(together, 1, 1e13, 1.0, lambda job, loads, now: "p00", (16_384,))
    assert queued["ttft_p50_s"] == 0.55 and queued["ttft_mean_s"] == 0.55  # 0.1, 0.2, ... 1.0
    # the same arrivals twice as fast (time_scale 2) on two engines in turn
    turn = itertools.count()
    two = simulate(spaced, 2, 1e13, 2.0, lambda job, loads, now: loads[next(turn) % 2].id, (16_384,))
    assert two["ttft_p99_s"] == 0.1 and two["load_max_over_mean"] == 1.0


def test_prefill_bench_cli_prints_json(tmp_path, capsys):
    trace = _trace(tmp_path / "t.jsonl", _rows(30))
    args = _parser().parse_args(
        ["bench", "prefill-lb", "--json", "--trace", str(trace), "--engines", "2", "--limit", "20"]
    )
    assert args.func(args) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["requests"] == 20 and figures["engines"] == 2


def test_prefill_bench_defaults():
    args = _parser().parse_args(["bench", "prefill-lb"])
    assert (args.engines, args.utilization, args.engine_pflops, args.limit) == (8, 0.7, 1.0, 0)
