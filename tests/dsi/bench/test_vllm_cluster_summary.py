"""dsi bench vllm-cluster's figures: per side over a replay, and dsi / peer against the goals."""

from dsi.bench.peers_served_client import ServedRun, StreamStat
from dsi.bench.vllm_cluster_summary import (
    CLUSTER_GOALS,
    SINGLE_GOALS,
    PromptCounters,
    compare,
    deltas,
    merged,
    ratio,
    side_figures,
)


def _run(wall_s: float, *ttfts: float | None, tokens: int = 24, prompt: int = 1000) -> ServedRun:
    return ServedRun(wall_s, [StreamStat(t, tokens if t is not None else 0, None, prompt) for t in ttfts])


def test_side_figures_over_a_replay():
    run = _run(4.0, 0.1, 0.2, 0.3, 0.4)
    instances = [PromptCounters(1500, 1000, 500, 3000), PromptCounters(500, 500, 0, 1000)]
    f = side_figures(run, instances)
    assert f.requests == 4 and f.failed == 0
    assert f.computed_tokens_per_request == 500.0 and f.computed_check_per_request == 500.0
    assert f.computed_by_instance == [1500, 500]
    assert (f.local_hit_tokens, f.loaded_tokens) == (1500, 500)
    assert f.prompt_tokens_per_request == 1000.0
    assert (f.ttft_p50_ms, f.ttft_p99_ms) == (200.0, 400.0)
    assert f.output_tokens == 96 and f.output_tok_s == 24.0


def test_failed_streams_count_and_unknown_counters_stay_unknown():
    run = ServedRun(1.0, [StreamStat(0.1, 24, None, 10), StreamStat(None, 0, "HTTP 500: boom")])
    f = side_figures(run, None)
    assert f.failed == 1 and f.errors == ["HTTP 500: boom"]
    assert f.computed_tokens_per_request is None and f.ttft_p99_ms == 100.0


def test_merged_runs_add_their_wall_times():
    both = merged([_run(2.0, 0.1), _run(3.0, 0.2, 0.3)])
    assert both.wall_s == 5.0 and len(both.streams) == 3


def test_ratios_are_dsi_over_peer_and_goals_are_judged_on_them():
    dsi = side_figures(_run(2.0, 0.1, 0.3), [PromptCounters(computed=1000)])
    peer = side_figures(_run(4.0, 0.2, 0.2), [PromptCounters(computed=1500), PromptCounters(computed=500)])
    out = compare(dsi, peer, CLUSTER_GOALS)
    assert out["computed_tokens_per_request"] == {
        "dsi": 500.0,
        "peer": 1000.0,
        "dsi_over_peer": 0.5,
        "goal": "<= 0.6",
        "met": True,
    }
    assert out["ttft_p50_ms"]["dsi_over_peer"] == 0.5 and out["ttft_p50_ms"]["met"] is True
    assert out["ttft_p99_ms"]["dsi_over_peer"] == 1.5 and out["ttft_p99_ms"]["met"] is False
    assert out["output_tok_s"]["dsi_over_peer"] == 2.0 and out["output_tok_s"]["met"] is True


def test_a_missing_side_or_a_figure_without_goal_is_not_judged():
    peer = side_figures(_run(1.0, 0.2), [PromptCounters(computed=10)])
    out = compare(None, peer, SINGLE_GOALS)
    assert out["output_tok_s"]["dsi_over_peer"] is None and out["output_tok_s"]["met"] is None
    both = compare(peer, peer, SINGLE_GOALS)
    assert both["output_tok_s"]["met"] is True and both["ttft_p50_ms"] == {
        "dsi": 200.0,
        "peer": 200.0,
        "dsi_over_peer": 1.0,
        "goal": "none",
        "met": None,
    }
    assert ratio(1.0, 0.0) is None and ratio(None, 1.0) is None


def test_counters_add_and_subtract_field_by_field():
    a, b = PromptCounters(5, 4, 3, 12), PromptCounters(1, 1, 1, 3)
    assert a + b == PromptCounters(6, 5, 4, 15) and a - b == PromptCounters(4, 3, 2, 9)
    assert deltas([a, a], [b, a]) == [PromptCounters(4, 3, 2, 9), PromptCounters()]
