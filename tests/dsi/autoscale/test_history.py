"""The decision log keeps the last 100 decisions, each with the inputs it was made from."""

from __future__ import annotations

import pytest

from dsi.autoscale import DecisionLog, RoleBounds
from tests.dsi.autoscale.cases import decide_decode


def test_keeps_the_last_100_with_their_inputs():
    log = DecisionLog()
    bounds = RoleBounds(max_instances=200, max_change=200)
    for step in range(150):
        log.record(
            decide_decode(
                bounds, now_s=float(step), previous=log.latest(), serving=1, capacity=1, demand=step
            )
        )
    entries = log.entries()
    assert (len(log), log.capacity, len(entries)) == (100, 100, 100)
    assert [entry.inputs.now_s for entry in entries] == [float(step) for step in range(50, 150)]
    assert [entry.inputs.decode.demand for entry in entries] == list(range(50, 150))
    assert log.latest() is entries[-1]
    assert entries[-1].decode.need == 179  # 149 * 1.2 = 178.8


def test_empty_log_and_bad_capacity():
    assert DecisionLog(3).latest() is None
    with pytest.raises(ValueError, match="capacity must be a positive integer, got 0"):
        DecisionLog(0)
