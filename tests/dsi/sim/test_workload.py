"""Simulated requests: validation and time scaling."""

from __future__ import annotations

import pytest

from dsi.sim.workload import EMPTY_KEYS, SimRequest, span_s, time_scaled


def _req(i: int, t: float) -> SimRequest:
    return SimRequest(
        id=i, arrival_s=t, prompt_tokens=10, output_tokens=2, keys=EMPTY_KEYS, persist_keys=EMPTY_KEYS
    )


def test_time_scaling_divides_arrivals():
    reqs = [_req(0, 0.0), _req(1, 10.0)]
    assert [r.arrival_s for r in time_scaled(reqs, 4.0)] == [0.0, 2.5]
    assert span_s(reqs) == 10.0
    with pytest.raises(ValueError):
        time_scaled(reqs, 0.0)


def test_bad_requests_are_refused():
    with pytest.raises(ValueError, match="traffic class"):
        SimRequest(
            id=0,
            arrival_s=0,
            prompt_tokens=1,
            output_tokens=1,
            keys=EMPTY_KEYS,
            persist_keys=EMPTY_KEYS,
            traffic_class="batch",
        )
    with pytest.raises(ValueError, match=">= 1 token"):
        SimRequest(
            id=0, arrival_s=0, prompt_tokens=1, output_tokens=0, keys=EMPTY_KEYS, persist_keys=EMPTY_KEYS
        )
