"""``dsi bench hit-load`` on a short hit: its settings, figures and in-run check."""

import argparse
import json

import pytest

from dsi.bench import cli as bench_cli
from dsi.kvcache.shm import SHM_DIR


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dsi")
    bench_cli.register(parser.add_subparsers(dest="command", required=True))
    return parser


def test_hit_load_bench_prints_its_figures_as_json(capsys):
    before = set(SHM_DIR.glob("dsi-bench-*"))
    args = _parser().parse_args(
        ["bench", "hit-load", "--json", "--hit-tokens", "256", "--tail-tokens", "8", "--repeats", "1"]
    )
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    s = out["settings"]
    assert (s["hit_tokens"], s["tail_tokens"], s["hit_pages"], s["repeats"]) == (256, 8, 2, 1)
    assert s["page_bytes"] == 65_536 and s["hit_bytes"] == 2 * 65_536
    assert s["computed_tokens"] == 140  # the bounded replay from R = consumer_start = 264 - 140
    assert [p["layer"] for p in s["page_parts"]] == [1, 3, 4]
    assert out["same_output"] is True  # the layered load gives the serial load's token and logprob
    assert out["ttft_ms_layered"] > 0 and out["ttft_ms_serial"] > 0
    assert abs(out["ratio"] - out["ttft_ms_layered"] / out["ttft_ms_serial"]) < 1e-3
    assert 0 < out["best_ratio"] <= 1 and out["forward_ms"] > 0 and out["copy_ms_serial_path"] > 0
    assert len(out["ttft_ms_runs"]["layered"]) == len(out["ttft_ms_runs"]["serial"]) == 1
    assert set(SHM_DIR.glob("dsi-bench-*")) == before  # its shared memory is unlinked


def test_hit_load_bench_refuses_a_partial_block():
    args = _parser().parse_args(["bench", "hit-load", "--hit-tokens", "200"])
    with pytest.raises(ValueError, match="multiple of 128"):
        args.func(args)
