import torch

from dsi.roles.state_cache import StateCache


def state(fill: float) -> torch.Tensor:
    return torch.full((2, 4, 8), float(fill))  # 256 bytes of fp32


def test_lru_under_a_byte_bound():
    cache = StateCache(max_bytes=3 * 256)
    for i in range(3):
        assert cache.put(bytes([i]) * 16, 128 * (i + 1), state(i))
    assert cache.get(bytes([0]) * 16)[0] == 128  # 0 is now the most recently used
    cache.put(bytes([3]) * 16, 512, state(3))
    assert cache.get(bytes([1]) * 16) is None  # the least recently used went
    boundary, rings = cache.get(bytes([0]) * 16)
    assert boundary == 128 and torch.equal(rings, state(0))
    assert len(cache) == 3 and cache.stats.bytes == 3 * 256 and cache.stats.evicted == 1


def test_replacing_an_entry_keeps_the_byte_count_and_oversized_states_are_refused():
    cache = StateCache(max_bytes=512)
    cache.put(b"a" * 16, 128, state(1))
    cache.put(b"a" * 16, 128, state(2))
    assert cache.stats.bytes == 256 and torch.equal(cache.get(b"a" * 16)[1], state(2))
    assert not cache.put(b"b" * 16, 128, torch.zeros(1024))
    assert cache.get(b"b" * 16) is None
