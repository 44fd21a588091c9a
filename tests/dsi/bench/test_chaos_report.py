"""How ``dsi bench chaos`` counts one fault: requests of the fault, recovery, leaks."""

from __future__ import annotations

from dsi.bench.chaos_load import Answer
from dsi.bench.chaos_report import Phase, phase_report, recovered_at
from dsi.bench.soak_probe import ProcFigures
from dsi.bench.soak_report import MB, GrowthLimits


def steady(t0: float, t1: float, every: float = 0.5, **kw) -> list[Answer]:
    out, t = [], t0
    while t < t1:
        out.append(Answer(0, t, t + every, **kw))
        t += every
    return out


def test_recovery_is_the_first_window_after_the_heal_with_no_failure_and_the_old_rate():
    answers = [*steady(0, 10), Answer(0, 10, 12, error="peer_lost"), *steady(14, 30)]
    assert recovered_at(answers, 10.0, 2.0, 30.0, window_s=4.0) == 14.0  # [14, 18): 7 done, 1.75/s >= 0.8 * 2
    assert recovered_at(answers, 10.0, 2.0, 16.0, window_s=4.0) is None  # no whole window yet
    assert recovered_at(steady(0, 30, every=1.0), 10.0, 2.0, 30.0, window_s=4.0) is None  # half the rate


def test_with_no_completion_in_the_baseline_recovery_still_needs_a_completed_request():
    """Every client on a long request through the baseline: base rate 0. An empty window after the
    heal is not a recovery (the phase would end before a request of its own ran)."""
    answers = [Answer(0, 0.0, 21.0), Answer(1, 1.0, 21.5), *steady(21.5, 30)]
    assert recovered_at(answers, 10.0, 0.0, 20.0, window_s=2.0) is None
    assert recovered_at(answers, 10.0, 0.0, 30.0, window_s=2.0) == 19.5  # [19.5, 21.5) holds the first


def figs(pid: int, rss_mb: int, fds: int) -> ProcFigures:
    return ProcFigures(pid, rss_mb * MB, fds, 0, 0)


def test_a_fault_counts_its_own_requests_and_flags_growth_only_of_a_process_that_stayed():
    phase = Phase(
        "sigstop", base_from=0.0, inject=10.0, heal=15.0, end=30.0, min_serving={"decode": 1, "prefill": 2}
    )
    phase.before = {"decode-0": figs(1, 100, 20), "decode-1": figs(2, 100, 20)}
    phase.after = {"decode-0": figs(1, 200, 40), "decode-1": figs(3, 300, 60)}
    answers = [*steady(0, 10), Answer(1, 11, 12, error="x"), Answer(2, 11, 13, spliced=True), *steady(15, 30)]
    row = phase_report(phase, answers, window_s=4.0, limits=GrowthLimits())
    assert (row["sent"], row["failed"], row["lost"], row["spliced"]) == (32, 1, 1, 1)
    assert row["capacity_left"] and row["recovery_s"] == 0.0
    assert row["leaks"]["decode-1"]["replaced"] and not row["leaks"]["decode-1"]["flags"]
    assert row["leak_flags"] == ["decode-0: rss +100.0 MB (100%)", "decode-0: fds +20"]
