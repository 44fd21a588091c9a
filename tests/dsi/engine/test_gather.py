"""gather_delay: a lone request steps at once, a burst shares one first step, no hold is unbounded."""

import pytest

from dsi.engine.gather import MAX_GAPS, gather_delay

GAP = 0.010


def test_a_lone_request_is_never_held():
    assert gather_delay(5.0, [5.0], None, GAP) == 0.0
    assert gather_delay(5.0, [5.0], 4.0, GAP) == 0.0  # the one before came long ago


def test_a_burst_waits_for_a_quiet_gap_after_its_last_arrival():
    assert gather_delay(5.003, [5.0, 5.002], None, GAP) == pytest.approx(0.009)
    assert gather_delay(5.0125, [5.0, 5.002], None, GAP) == 0.0  # quiet for a gap: step
    # one arrival close behind the request before it (which took a step of its own) is a burst
    assert gather_delay(5.001, [5.0], 4.995, GAP) == pytest.approx(0.009)


def test_a_burst_that_keeps_coming_is_held_at_most_max_gaps():
    arrivals = [5.0 + 0.008 * i for i in range(20)]  # never quiet for a gap
    now = arrivals[-1]
    assert gather_delay(now, arrivals, None, GAP) == 0.0
    assert gather_delay(5.0 + 0.02, arrivals[:3], None, GAP) == pytest.approx(0.016 + GAP - 0.02)
    assert gather_delay(5.0, [5.0, 5.0], None, GAP) <= MAX_GAPS * GAP


def test_a_zero_gap_or_no_arrivals_never_holds():
    assert gather_delay(5.0, [5.0, 5.0], None, 0.0) == 0.0
    assert gather_delay(5.0, [], 4.999, GAP) == 0.0
