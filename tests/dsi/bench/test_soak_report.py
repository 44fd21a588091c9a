"""The soak's verdict parts: growth flags, excused failures, the summary, the private config."""

from __future__ import annotations

import re
from pathlib import Path

from dsi.bench.soak_cluster import private_config
from dsi.bench.soak_probe import ProcFigures
from dsi.bench.soak_report import MB, GrowthLimits, excused, format_summary, role_rows

REPO = Path(__file__).resolve().parents[3]


def fig(pid: int, rss_mb: float, fds: int = 40, shm_mb: float = 0.0) -> ProcFigures:
    return ProcFigures(pid, int(rss_mb * MB), fds, int(shm_mb * MB), 1 if shm_mb else 0)


def test_growth_above_the_limits_is_flagged_and_jitter_is_not():
    limits = GrowthLimits(rss_pct=10.0, rss_min_bytes=16 * MB, fds=8, shm_bytes=16 * MB)
    start = {"decode-0": fig(1, 300), "prefill-0": fig(2, 300), "kvstore-0": fig(3, 200)}
    warm = {"decode-0": fig(1, 500), "prefill-0": fig(2, 500), "kvstore-0": fig(3, 200)}
    end = {
        "decode-0": fig(1, 512, fds=48),
        "prefill-0": fig(2, 600, fds=49, shm_mb=20),
        "kvstore-0": fig(9, 150),
    }
    rows = role_rows(start, warm, end, limits)
    assert rows["decode-0"]["flags"] == []  # +12 MB (2%) and +8 fds: within the limits
    assert rows["prefill-0"]["flags"] == ["rss +100.0 MB (20%)", "fds +9", "shm +20.0 MB"]
    assert rows["kvstore-0"]["replaced"] and rows["kvstore-0"]["growth"]["rss_bytes"] == -50 * MB
    assert role_rows(start, warm, {}, limits)["decode-0"]["flags"] == ["not running at the end"]


def test_a_failure_is_excused_only_near_a_no_capacity_span():
    spans = [(100.0, 110.0)]
    assert excused(95.0, 101.0, spans, slack_s=5.0)  # under way when capacity went
    assert excused(112.0, 114.0, spans, slack_s=5.0)  # within the slack after it came back
    assert not excused(116.0, 120.0, spans, slack_s=5.0)
    assert not excused(50.0, 99.0, spans, slack_s=5.0)


def test_the_summary_names_every_role_the_kills_and_the_flags():
    rows = role_rows(
        {"decode-0": fig(1, 300)}, {"decode-0": fig(1, 300)}, {"decode-0": fig(1, 400)}, GrowthLimits()
    )
    report = {
        "minutes": 3.0,
        "verdict": "fail",
        "roles": rows,
        "requests": {"total": 10, "failed": 1, "failed_without_capacity": 1, "failed_with_capacity": 0},
        "kills": [{"at_s": 80.0, "role": "decode-0", "pid": 1, "back_after_s": 7.5}],
        "shm_orphans": {"bytes": 0, "files": 0},
        "after_stop": {"serve_exit": 0, "processes_left": [], "shm_bytes": 0, "shm_files": 0},
        "flags": ["decode-0: rss +100.0 MB (33%)"],
        "log": "/tmp/x/serve.log",
    }
    text = format_summary(report)
    assert "verdict fail" in text and "300/300/400" in text and "back after 7.5s" in text
    assert "FLAG: decode-0: rss +100.0 MB (33%)" in text and "1 failed (1 while no capacity" in text


def test_the_private_config_moves_ports_and_the_run_directory_but_shares_the_model(tmp_path):
    source = REPO / "configs" / "local.toml"
    text = private_config(source, tmp_path).read_text()
    ports = set(re.findall(r"127\.0\.0\.1:(\d+)", text))
    assert ports and not ports & set(re.findall(r"127\.0\.0\.1:(\d+)", source.read_text()))
    assert f'dir = "{(REPO / "run" / "models" / "tiny").resolve()}"' in text
    assert f'store_dir = "{tmp_path / "run" / "kvstore"}"' in text
