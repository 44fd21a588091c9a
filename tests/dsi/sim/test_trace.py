"""Mooncake traces as simulated requests: 512-token ids become 4 chained 128-token pages."""

from __future__ import annotations

import json

import numpy as np

from dsi.paths import trace
from dsi.sim.trace import TraceRequest, block_tokens, load_trace, trace_workload


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_shared_ids_share_pages_and_the_partial_last_id_is_not_a_page(tmp_path):
    path = tmp_path / "t.jsonl"
    _write(
        path,
        [
            {"timestamp": 1000, "input_length": 1100, "output_length": 7, "hash_ids": [5, 6, 9]},
            {"timestamp": 0, "input_length": 1600, "output_length": 1, "hash_ids": [5, 6, 20, 21]},
        ],
    )
    a, b = trace_workload(path)  # sorted by time: the 0 ms line first
    assert (a.arrival_s, b.arrival_s, b.output_tokens) == (0.0, 1.0, 7)
    assert len(a.keys) == 12 and len(b.keys) == 8  # 1600 // 128, 1100 // 128
    assert np.array_equal(a.keys[:8], b.keys[:8]) and b.persist_keys is b.keys


def test_block_tokens_expands_each_id_into_four_pages():
    assert block_tokens(TraceRequest(0.0, 1_100, (7, 8, 9))).size == 8 * 128


def test_the_conversation_trace_reads_whole():
    rows = load_trace(trace(), limit=50)
    assert len(rows) == 50 and all(r.output_length > 0 for r in rows)
