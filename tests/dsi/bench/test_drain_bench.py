"""``dsi bench drain`` on a tiny workload: the structure and invariants of its figures, never timing."""

from __future__ import annotations

import json

import pytest

from dsi.cli.main import main
from dsi.kvcache.layout import BlockLayout
from dsi.model.config import TINY


def test_the_drain_bench_prints_both_approaches_side_by_side(capsys):
    assert (
        main(
            [
                "bench",
                "drain",
                "--requests",
                "2",
                "--min-context",
                "300",
                "--max-context",
                "300",
                "--grace",
                "0.2",
                "--max-tokens",
                "160",
                "--json",
            ]
        )
        == 0
    )
    # enough tokens that no request finishes within the grace period, even on a fast machine
    figures = json.loads(capsys.readouterr().out)
    assert figures["requests"] == 2
    assert figures["migrate_s"] > 0 and figures["recompute_s"] > 0
    # the ratio is taken before the times are rounded for printing
    ratio = figures["migrate_s"] / figures["recompute_s"]
    assert figures["migrate_vs_recompute"] == pytest.approx(ratio, rel=2e-3, abs=2e-4)
    assert 0 < figures["stall_ms_p50"] <= figures["stall_ms_p99"]
    page_mib = BlockLayout(TINY).elems * 4 / 2**20
    assert figures["precopied_mib"] == round(2 * 2 * page_mib, 2)  # 300 positions: 2 full pages each
    assert figures["tail_mib"] > 0
