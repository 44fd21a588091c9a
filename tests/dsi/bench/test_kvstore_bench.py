"""``dsi bench kvstore`` and ``dsi bench trace-hits`` end to end on tiny sizes: every figure is
reported (speed is not asserted: a benchmark prints figures, the machine may be shared), and the
trace replay's rules (full pages, usable hit, persist delay, local caches) on hand-made traces."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from dsi.bench import cli as bench_cli
from dsi.bench.kvstore import format_table
from dsi.bench.trace_hits import TraceRequest, block_tokens, replay
from dsi.kvcache.hashchain import HashChain, keys_of

KVSTORE_FIGURES = (
    "match_ms_1m",
    "hash_ns_per_token",
    "sha256_ns_per_token",
    "write_ratio",
    "read_ratio",
    "read_ratio_warm",
    "raw_read_1thread_mib_s",
    "index_bytes_per_block",
)
TRACE = (
    Path(__file__).resolve().parents[3]
    / ".."
    / "shared"
    / "data"
    / "traces"
    / "mooncake_conversation_trace.jsonl"
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dsi")
    bench_cli.register(parser.add_subparsers(dest="command", required=True))
    return parser


def test_kvstore_bench_prints_every_figure(capsys, tmp_path):
    args = _parser().parse_args(
        [
            "bench",
            "kvstore",
            "--json",
            "--index-blocks",
            "20000",
            "--io-mib",
            "4",
            "--repeats",
            "1",
            "--read-workers",
            "3",
            "--dir",
            str(tmp_path),
        ]
    )
    assert args.func(args) == 0
    figures = json.loads(capsys.readouterr().out)
    for name in KVSTORE_FIGURES:
        assert figures[name] > 0, name
    assert figures["match_hit_blocks"] == 8192 and figures["index_blocks"] == 20000
    assert figures["index_bytes_per_block"] <= 200
    # the headline read ratio compares equal thread counts: the pool's 3 threads with 3 raw readers
    assert figures["read_threads"] == 3
    assert figures["read_ratio"] == round(figures["read_mib_s"] / figures["raw_read_mib_s"], 3)
    assert list(tmp_path.iterdir()) == []  # its files are gone
    table = format_table(figures)
    assert "target >= 0.70" in table and "cold, 3 threads each" in table


def test_kvstore_defaults_are_short():
    args = _parser().parse_args(["bench", "kvstore"])
    assert (args.index_blocks, args.io_mib, args.repeats) == (1_000_000, 256, 3)


def test_trace_expansion_and_replay_on_a_hand_made_trace():
    a = TraceRequest(0.0, 1100, (1, 2, 3))  # 2 full ids + 76 tokens: 8 full pages
    b = TraceRequest(1.0, 1024 + 300, (1, 2, 9))  # shares 1024 tokens with a
    assert block_tokens(a).size == 8 * 128 and block_tokens(b).size == 10 * 128
    chains = _chains([a, b])
    rate, distinct = replay([a, b], chains, 0)
    assert distinct == 8 + 2 and rate == 8 * 128 / (1100 + 1324)
    assert replay([a, b], chains, 1)[0] == 128 / (1100 + 1324)  # only the head page fits


def test_a_hit_leaves_the_last_prompt_token_to_compute():
    a = TraceRequest(0.0, 1024, (1, 2))  # exactly 8 pages
    assert a.usable_pages == 7
    rate, _ = replay([a, a], _chains([a, a]), 0)
    assert rate == 7 * 128 / 2048  # the second sees all 8 pages stored and can use 7


def test_pages_are_hit_only_once_persisted():
    a, b = TraceRequest(0.0, 600, (1, 2)), TraceRequest(0.5, 600, (1, 2))  # 4 full pages each
    chains = _chains([a, b])
    assert replay([a, b], chains, 0, persist_delay_s=0.0)[0] == 4 * 128 / 1200
    assert replay([a, b], chains, 0, persist_delay_s=1.0)[0] == 0  # b arrived before a's prefill ended
    c = TraceRequest(2.0, 600, (1, 2))
    assert replay([a, b, c], _chains([a, b, c]), 0, persist_delay_s=1.0)[0] == 4 * 128 / 1800


def test_local_caches_hit_only_their_own_instances_requests():
    # four turns of one conversation (turn t: t + 1 full ids of 4 pages, then 100 more tokens),
    # round-robin over 2 instances: turns 0 and 2 on one, 1 and 3 on the other
    turns = [TraceRequest(float(t), 512 * (t + 1) + 100, tuple(range(t + 2))) for t in range(4)]
    chains = _chains(turns)
    prompt = sum(r.input_length for r in turns)
    shared, _ = replay(turns, chains, 0)
    local, held = replay(turns, chains, 0, instances=2)
    assert shared == 128 * (4 + 8 + 12) / prompt  # each turn hits all of the turn before
    assert local == 128 * (4 + 8) / prompt  # turn 2 hits turn 0 (4 pages), turn 3 turn 1 (8)
    assert held == 12 + 16  # each instance holds its last turn's pages


def test_without_persisting_after_a_hit_only_misses_fill_the_store():
    turns = [TraceRequest(float(t), 512 * (t + 1) + 100, tuple(range(t + 2))) for t in range(3)]
    rate, held = replay(turns, _chains(turns), 0, persist_after_hit=False)
    assert held == 4  # turn 0 (a miss) persisted its 4 full pages; turns 1 and 2 hit and did not
    assert rate == 128 * (4 + 4) / sum(r.input_length for r in turns)


def _chains(requests: list[TraceRequest]) -> list:
    chain = HashChain(block_size=128)
    return [keys_of(chain.hashes(block_tokens(r))).copy() for r in requests]


@pytest.mark.skipif(not TRACE.exists(), reason=f"no trace at {TRACE}")
def test_trace_hits_cli_on_the_first_requests(capsys):
    args = _parser().parse_args(["bench", "trace-hits", "--json", "--limit", "300", "--trace", str(TRACE)])
    assert args.func(args) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["requests"] == 300 and figures["routing"] == "round-robin"
    caps = figures["capacities"]
    assert list(caps) == ["unbounded", "10pct", "1pct"] and caps["unbounded"]["pages"] == 0
    for c in caps.values():
        for key in (
            "shared_hit_rate",
            "local4_hit_rate",
            "local16_hit_rate",
            "shared_hit_rate_no_state_pulled",
        ):
            assert 0 <= c[key] < 1, (key, c)
    # unbounded, a cache that holds a subset of the pages at all times never hits more: a local
    # cache holds a subset of the shared store (local16's a subset of local4's under round-robin),
    # the store of "replay hits persist nothing" a subset of the store where every request persists
    c = caps["unbounded"]
    assert c["local16_hit_rate"] <= c["local4_hit_rate"] <= c["shared_hit_rate"]
    assert c["shared_hit_rate_no_state_pulled"] <= c["shared_hit_rate"]
    assert (
        0
        < caps["1pct"]["shared_hit_rate"]
        <= caps["10pct"]["shared_hit_rate"]
        <= caps["unbounded"]["shared_hit_rate"]
    )
