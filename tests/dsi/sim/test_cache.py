"""Page caches on the real BlockIndex: TTL from the first put, one index or one per instance."""

from __future__ import annotations

import numpy as np

from dsi.sim.cache import PageCaches, SimClock

DAY = 86_400.0


def _keys(n: int, start: int = 1) -> np.ndarray:
    return np.stack([np.arange(start, start + n, dtype=np.uint64), np.zeros(n, dtype=np.uint64)], axis=1)


def test_a_page_lives_its_class_ttl_from_its_first_put():
    clock = SimClock()
    caches = PageCaches("global", clock, ttls_s={"chatbot": 7 * DAY, "agent": 3 * DAY})
    assert caches.put("p0", _keys(4), "chatbot") == 4
    clock.t = 5 * DAY
    assert caches.put("p1", _keys(6), "chatbot") == 2  # re-put: touched, creation kept
    assert caches.stored("p2", _keys(6)) == 6
    clock.t = 7 * DAY + 1
    assert caches.stored("p0", _keys(6)) == 0  # the first 4 expired: the chain breaks at its head
    caches.expire()
    assert caches.pages() == 2


def test_agent_pages_expire_sooner():
    clock = SimClock()
    caches = PageCaches("global", clock)
    caches.put("", _keys(3), "agent")
    caches.put("", _keys(3, start=100), "chatbot")
    clock.t = 4 * DAY
    assert caches.stored("", _keys(3)) == 0 and caches.stored("", _keys(3, start=100)) == 3


def test_local_caches_are_separate_and_bounded():
    caches = PageCaches("local", SimClock(), capacity=4)
    caches.put("p0", _keys(3), "chatbot")
    assert caches.stored("p0", _keys(3)) == 3 and caches.stored("p1", _keys(3)) == 0
    caches.put("p0", _keys(10, start=50), "chatbot")
    assert caches.index("p0").capacity == 4 and len(caches.index("p0")) <= 4
