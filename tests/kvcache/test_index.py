"""BlockIndex: TTL per traffic class (injectable clock), LRU under a capacity, chain-tail eviction."""

import numpy as np
import pytest

from dsi.kvcache.index import BlockIndex, Locations, class_code

DAY = 86400.0


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def keys(start: int, n: int) -> np.ndarray:
    k = np.zeros((n, 2), dtype=np.uint64)
    k[:, 0] = np.arange(start, start + n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)  # wraps
    k[:, 1] = np.arange(start, start + n)
    return k


def where(n: int) -> Locations:
    z = np.arange(n)
    return Locations(z.astype(np.uint32), z.astype(np.uint64), z.astype(np.uint32) + 1, z.astype(np.uint64))


def put(index: BlockIndex, k: np.ndarray, cls: str = "chatbot"):
    fresh = index.fresh(k)
    return index.insert(k[fresh], where(len(fresh)), class_code(cls))


def test_agent_and_chatbot_blocks_expire_on_their_own_ttls():
    clock = Clock()
    index = BlockIndex(clock=clock)
    agent, chat = keys(0, 4), keys(100, 4)
    put(index, agent, "agent")
    put(index, chat, "chatbot")
    clock.t += 3 * DAY - 1
    assert index.match_prefix(agent) == 4 and index.match_prefix(chat) == 4
    clock.t += 2
    assert index.match_prefix(agent) == 0  # a miss at once, before any sweep
    assert index.match_prefix(chat) == 4
    assert index.expire().keys.shape == (4, 2) and len(index) == 4 and index.expired == 4
    clock.t += 4 * DAY
    assert index.match_prefix(chat) == 0
    index.expire()
    assert len(index) == 0


def test_ttls_come_from_config_and_expired_keys_can_be_put_again():
    clock = Clock()
    index = BlockIndex(ttls_s={"agent": 10.0, "chatbot": 20.0}, clock=clock)
    k = keys(0, 2)
    put(index, k, "agent")
    clock.t += 11
    assert index.fresh(k).tolist() == [0, 1]  # expired = absent to a put
    removed = put(index, k, "chatbot")
    assert removed.keys.shape == (2, 2)  # the stale copies are replaced
    assert len(index) == 2 and index.record(k[0].tobytes()).traffic_class == "chatbot"
    clock.t += 15
    assert index.match_prefix(k) == 2


def test_capacity_eviction_is_lru():
    index = BlockIndex(capacity=4)
    a, b, c, d, e = (keys(i, 1) for i in range(5))
    for k in (a, b, c, d):
        put(index, k)
    index.match_prefix(a, touch=True)  # a is now the most recently used
    evicted = put(index, e)
    assert [r.tobytes() for r in evicted.keys] == [b.tobytes()]
    assert index.evicted == 1 and len(index) == 4
    assert [index.match_prefix(k) for k in (a, b, c, d, e)] == [1, 0, 1, 1, 1]


def test_a_chain_is_evicted_from_its_tail():
    index = BlockIndex(capacity=6)
    chain = keys(0, 6)
    put(index, chain)
    evicted = put(index, keys(50, 2))
    assert {r.tobytes() for r in evicted.keys} == {chain[4].tobytes(), chain[5].tobytes()}
    assert index.match_prefix(chain) == 4


def test_slack_evicts_a_batch_once_past_256_blocks():
    index = BlockIndex(capacity=1024)
    put(index, keys(0, 1024))
    evicted = put(index, keys(5000, 1))
    assert len(evicted.keys) == 1 + 1024 // 256 and len(index) == 1024 - 4
    with pytest.raises(ValueError):
        put(index, keys(9000, 2000))


def test_record_fields_and_memory_per_block():
    clock = Clock(123.0)
    index = BlockIndex(clock=clock, expected=10_000)
    put(index, keys(0, 10_000), "agent")
    rec = index.record(keys(7, 1).tobytes())
    assert (rec.segment, rec.offset, rec.size, rec.traffic_class) == (7, 7, 8, "agent")
    assert rec.created == rec.last_access == 123.0
    assert index.record(keys(99_999, 1).tobytes()) is None
    assert index.nbytes / len(index) <= 200
