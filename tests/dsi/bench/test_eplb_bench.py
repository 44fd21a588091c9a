"""``dsi bench eplb`` on a small trace (no live group): the figures and their invariants."""

import argparse
import json

from dsi.bench import cli as bench_cli
from dsi.bench.eplb import skewed_trace


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dsi")
    bench_cli.register(parser.add_subparsers(dest="command", required=True))
    return parser


def test_trace_pairs_name_distinct_experts_per_token():
    [[pairs]] = skewed_trace(1, 16, 4, 32, 1, 1.0, seed=1)
    assert pairs.shape == (128,)
    assert all(len(set(pairs[i : i + 4].tolist())) == 4 for i in range(0, 128, 4))


def test_eplb_bench_cli_prints_json(capsys):
    assert "dsi.bench.eplb" in bench_cli._BENCHES
    shape = ["--experts", "16", "--top-k", "2", "--ranks", "4", "--layers", "2"]
    args = _parser().parse_args(
        [
            "bench",
            "eplb",
            "--json",
            *shape,
            "--tokens",
            "2048",
            "--steps",
            "2",
            "--pause-ranks",
            "1",
            "--dp-ranks",
            "1",
        ]
    )
    assert args.func(args) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["imbalance_before"] > 1.3  # Zipf skew over 4 contiguous groups of 4 experts
    assert 1.0 <= figures["imbalance_after"] <= 1.05 < figures["imbalance_before"]
    assert figures["imbalance_after_window"] < 1.02
    assert "pause_ms" not in figures and "dp_step_ms" not in figures
