"""``dsi bench kvstore`` and ``dsi bench trace-hits`` end to end on tiny sizes: every figure is
reported (speed is not asserted: a benchmark prints figures, the machine may be shared)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from dsi.bench import cli as bench_cli
from dsi.bench.kvstore import format_table
from dsi.bench.trace_hits import TraceRequest, block_tokens, replay
from dsi.kvcache.hashchain import HashChain, keys_of

KVSTORE_FIGURES = ("match_ms_1m", "hash_ns_per_token", "sha256_ns_per_token", "write_ratio", "read_ratio",
                   "index_bytes_per_block")
TRACE = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "traces" / "mooncake_conversation_trace.jsonl"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dsi")
    bench_cli.register(parser.add_subparsers(dest="command", required=True))
    return parser


def test_kvstore_bench_prints_every_figure(capsys, tmp_path):
    args = _parser().parse_args(["bench", "kvstore", "--json", "--index-blocks", "20000", "--io-mib", "4",
                                 "--repeats", "1", "--dir", str(tmp_path)])
    assert args.func(args) == 0
    figures = json.loads(capsys.readouterr().out)
    for name in KVSTORE_FIGURES:
        assert figures[name] > 0, name
    assert figures["match_hit_blocks"] == 8192 and figures["index_blocks"] == 20000
    assert figures["index_bytes_per_block"] <= 200
    assert list(tmp_path.iterdir()) == []  # its files are gone
    assert "target >= 0.70" in format_table(figures)


def test_trace_expansion_and_replay_on_a_hand_made_trace():
    a = TraceRequest(0.0, 1100, (1, 2, 3))  # 2 full ids + 76 tokens: 8 full blocks
    b = TraceRequest(1.0, 1024 + 300, (1, 2, 9))  # shares 1024 tokens with a
    assert block_tokens(a, 128).size == 8 * 128 and block_tokens(b, 128).size == 10 * 128
    chain = HashChain(block_size=128)
    chains = [keys_of(chain.hashes(block_tokens(r, 128))).copy() for r in (a, b)]
    rate, distinct = replay([a, b], chains, 0, 128)
    assert distinct == 8 + 2 and rate == 8 * 128 / (1100 + 1324)
    assert replay([a, b], chains, 1, 128)[0] == 128 / (1100 + 1324)  # only the head block fits
    assert block_tokens(a, 256).size == 4 * 256  # other block sizes: 2 children per 512-token id


@pytest.mark.skipif(not TRACE.exists(), reason=f"no trace at {TRACE}")
def test_trace_hits_cli_on_the_first_requests(capsys):
    args = _parser().parse_args(["bench", "trace-hits", "--json", "--limit", "300", "--trace", str(TRACE)])
    assert args.func(args) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["requests"] == 300
    assert 0 < figures["hit_rate_1pct"] <= figures["hit_rate_10pct"] <= figures["hit_rate_unbounded"] < 1
