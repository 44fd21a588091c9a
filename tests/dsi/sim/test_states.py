"""SWA ring snapshots: held by key, least recently used ones go first."""

from __future__ import annotations

from dsi.sim.states import RingSnapshots


def test_lru_under_a_capacity():
    s = RingSnapshots(capacity=2)
    s.announce(b"a", 0.0)
    s.announce(b"b", 1.0)
    assert s.pull(b"a")  # a is now the most recent
    s.announce(b"c", 2.0)
    assert s.pull(b"a") and s.pull(b"c") and not s.pull(b"b") and len(s) == 2
