"""Arrival processes: seeded, at their mean rate, with their shapes."""

from __future__ import annotations

import random

import pytest

from dsi.sim.arrivals import bursty, diurnal, poisson


@pytest.mark.parametrize("process", [poisson, bursty, diurnal])
def test_seeded_sorted_and_at_the_mean_rate(process):
    a = process(random.Random(3), 5.0, 86_400.0)
    assert a == process(random.Random(3), 5.0, 86_400.0) and a == sorted(a)
    assert len(a) == pytest.approx(5.0 * 86_400, rel=0.05)


def test_diurnal_peaks_where_asked():
    a = diurnal(random.Random(1), 2.0, 86_400.0, peak_to_trough=4.0, peak_s=12 * 3600)
    peak = sum(1 for t in a if 11 * 3600 <= t < 13 * 3600)
    trough = sum(1 for t in a if t < 3600 or t >= 23 * 3600)
    assert peak / trough == pytest.approx(4.0, rel=0.2)


def test_bursts_raise_the_rate_in_short_windows():
    a = bursty(random.Random(2), 2.0, 36_000.0, factor=10.0)
    per_minute = [0] * 600
    for t in a:
        per_minute[int(t // 60)] += 1
    assert max(per_minute) > 5 * 2.0 * 60 / 2


def test_bad_rates_are_refused():
    with pytest.raises(ValueError):
        poisson(random.Random(0), 0.0, 10.0)
