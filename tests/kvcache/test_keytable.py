"""KeyTable / KeySet against a Python set: random adds and removes, growth, tombstones."""

import numpy as np

from dsi.kvcache.keytable import KeySet


def rand_keys(rng, n):
    return rng.integers(0, 2**64, size=(n, 2), dtype=np.uint64)


def as_set(keys: np.ndarray) -> set[bytes]:
    return {k.tobytes() for k in keys}


def test_keyset_follows_a_python_set_through_growth_and_removal():
    rng = np.random.default_rng(0)
    ks, ref = KeySet(), set()
    pool = rand_keys(rng, 6000)
    for _ in range(40):
        add = pool[rng.integers(0, len(pool), size=300)]
        ks.add(add)
        ref |= as_set(add)
        drop = pool[rng.integers(0, len(pool), size=150)]
        ks.remove(drop)
        ref -= as_set(drop)
        assert len(ks) == len(ref)
    assert as_set(ks.all()) == ref
    probe = pool[:2000]
    assert ks.contains(probe).tolist() == [k.tobytes() in ref for k in probe]


def test_colliding_home_positions_and_prefix_match():
    ks = KeySet()
    keys = np.zeros((50, 2), dtype=np.uint64)
    keys[:, 1] = np.arange(50)  # same low word: one home position, a long probe run
    ks.add(keys)
    assert len(ks) == 50 and ks.contains(keys).all()
    ks.remove(keys[10:20])
    assert ks.match_prefix(keys) == 10
    ks.add(keys[10:20])
    assert ks.match_prefix(keys) == 50
    ks.clear()
    assert len(ks) == 0 and ks.match_prefix(keys) == 0
