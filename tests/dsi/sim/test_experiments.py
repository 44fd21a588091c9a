"""Experiments: every one builds its variants; one runs end to end and makes its table."""

from __future__ import annotations

import pytest

from dsi.sim.experiments import EXPERIMENTS, run_experiment
from dsi.sim.report import table


def test_the_six_studies_of_the_issue_are_there():
    assert sorted(e.letter for e in EXPERIMENTS.values()) == list("abcdef")


def test_decode_lb_runs_quick_and_tabulates():
    result = run_experiment("decode-lb", quick=True)
    assert result["command"] == "dsi sim experiment decode-lb --quick"
    assert [v["name"] for v in result["variants"]] == ["bands", "least-loaded", "round-robin"]
    text = table(result)
    assert text.splitlines()[0].startswith("| variant | TBT p50 ms") and len(text.splitlines()) == 5
    with pytest.raises(ValueError, match="unknown experiment"):
        run_experiment("ttl-9")
