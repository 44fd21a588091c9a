"""Processor sharing on one host: the pace, the work clock, and a cluster whose instances compute
at once against one that has a device per instance."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dsi.sim.cluster import Cluster
from dsi.sim.config import SimConfig
from dsi.sim.host import HostShare, WorkClock
from dsi.sim.profiles import get_profile
from dsi.sim.workload import SimRequest


def test_the_pace_is_one_until_the_busy_threads_outnumber_the_cores():
    host = HostShare(cores=2, threads=1)
    assert [host.pace(k) for k in (0, 1, 2, 3, 4)] == [1.0, 1.0, 1.0, 1.5, 2.0]
    assert HostShare(cores=2, threads=2).pace(3) == 3.0
    assert not HostShare().shared and HostShare().pace(64) == 1.0
    with pytest.raises(ValueError):
        HostShare(cores=-1)


def test_the_work_clock_maps_both_ways_across_pace_changes():
    clock = WorkClock()
    clock.set_pace(10.0, 2.0)  # 10 s of work by wall 10, then half speed
    assert clock.work(14.0) == 12.0 and clock.wall(12.0) == 14.0
    clock.set_pace(14.0, 1.0)
    assert clock.work(16.0) == 14.0 and clock.wall(13.0) == 15.0  # from the last anchor on


def _requests(n: int) -> list[SimRequest]:
    """``n`` prompts of 2,000 tokens at once, nothing shared (no keys: no hits)."""
    keys = np.zeros((0, 2), dtype=np.uint64)
    return [SimRequest(i, 0.0, 2_000, 4, keys, keys) for i in range(n)]


def _ttft(cfg: SimConfig, requests: list[SimRequest]) -> list[float]:
    return [float(t) for t in Cluster(cfg, get_profile("cpu"), requests).run().rec.ttft_s]


def test_instances_computing_at_once_on_a_shared_host_take_longer_together():
    alone = SimConfig(prefills=2, decodes=2, prefill_lb="round-robin")
    shared = dataclasses.replace(alone, shared_cores=2, engine_threads=2)
    one = _ttft(alone, _requests(1))[0]
    assert _ttft(shared, _requests(1))[0] == pytest.approx(one)  # alone on the host: no change
    apart, together = _ttft(alone, _requests(2)), _ttft(shared, _requests(2))
    assert apart == pytest.approx([one, one])  # a device each: two prompts at once cost one
    # Two prefills share the cores: both forwards take twice as long, the handoffs do not.
    assert all(t > 1.5 * one for t in together)
    assert _ttft(dataclasses.replace(shared, engine_threads=1), _requests(2)) == pytest.approx(apart)
