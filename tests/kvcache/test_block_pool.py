import pytest

from dsi.kvcache.block_pool import NULL_BLOCK, BlockPool, NoFreeBlocks
from dsi.kvcache.state_slots import NoFreeSlots, StateSlots
from dsi.model.config import TINY


def test_allocate_free_refcounts_and_null_block():
    pool = BlockPool(6, 4)
    a = pool.allocate(3)
    assert NULL_BLOCK not in a and pool.num_free == 2 and pool.num_used == 3
    with pytest.raises(NoFreeBlocks):
        pool.allocate(3)
    assert pool.num_free == 2  # a failed allocation takes nothing
    pool.free(a)
    assert pool.num_free == 5
    with pytest.raises(ValueError, match="freed more often"):
        pool.free([a[0]])


def test_free_list_is_in_eviction_order_and_hashed_pages_are_revived():
    pool = BlockPool(5, 4)
    first, second = pool.allocate(2), pool.allocate(2)
    pool.set_hash(first[0], "h0")
    pool.free(first)  # tail first: first[1] is evicted before first[0]
    pool.free(second)
    assert pool.lookup("h0") == first[0] and pool.ref(first[0]) == 1
    pool.free([first[0]])
    got = pool.allocate(3)  # least recently freed pages first; the hashed one is the last resort
    assert first[0] not in got
    assert pool.allocate(1) == [first[0]]
    assert pool.lookup("h0") is None  # reusing the page dropped its hash


def test_shared_page_survives_one_free():
    pool = BlockPool(3, 4)
    (b,) = pool.allocate(1)
    pool.set_hash(b, "x")
    assert pool.lookup("x") == b and pool.ref(b) == 2
    pool.free([b])
    assert pool.num_free == 1 and pool.ref(b) == 1


def test_state_slots_are_zeroed_and_bounded():
    slots = StateSlots(TINY, 2)
    s = slots.allocate()
    slots.rings[s].fill_(3.0)
    slots.free(s)
    s2, s3 = slots.allocate(), slots.allocate()
    assert float(slots.rings[s2].abs().sum()) == 0 and float(slots.rings[s3].abs().sum()) == 0
    with pytest.raises(NoFreeSlots):
        slots.allocate()
    with pytest.raises(ValueError):
        slots.free(7)
    assert slots.rings.shape[1:] == (TINY.n_layers, 2, 134, TINY.n_kv_heads, TINY.head_dim)
