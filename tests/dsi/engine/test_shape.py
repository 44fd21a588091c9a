"""EngineShape: the sizes a role needs, equal to what the engine itself uses."""

import dataclasses
import math

import pytest

from dsi.engine import Engine, EngineConfig, EngineShape, StateLayout
from dsi.kvcache.hashchain import HashChain
from dsi.model.config import FLASH, TINY


def test_the_shape_matches_the_engine_it_describes(tiny):
    cfg, w = tiny
    engine = Engine(cfg, w, EngineConfig(num_blocks=20, num_slots=3, root_seed=9))
    shape = engine.shape
    pool = engine.runner.pool
    assert shape.page_elems == pool.pages.shape[1] and shape.page_bytes == pool.pages[0].nbytes
    assert shape.num_pages == pool.num_free == 19 and shape.num_slots == engine.runner.slots.num_free == 3
    assert shape.block_size == cfg.block_size == shape.hash_chain.block_size
    assert shape.hash_chain == HashChain.of(cfg, 9)
    assert shape.ring_shape == (cfg.n_producer, 2, cfg.block_size, cfg.n_kv_heads, cfg.head_dim)
    assert shape.ring_bytes == math.prod(shape.ring_shape) * 4
    assert shape.keep == cfg.keep
    for n in (0, 1, 5):
        assert shape.state_layout(n) == StateLayout.of(cfg, n)
        assert shape.state_nbytes(n) == StateLayout.of(cfg, n).nbytes
    assert (shape.blocks(1), shape.blocks(128), shape.blocks(129)) == (1, 1, 2)
    engine.close()
    with pytest.raises(dataclasses.FrozenInstanceError):
        shape.block_size = 64  # type: ignore[misc]


def test_keep_follows_the_engines_replay_setting_and_the_block_size_the_model():
    assert EngineShape.of(TINY, num_blocks=4, num_slots=1, replay=False).keep is None
    small = dataclasses.replace(TINY, name="small", block_size=64)
    shape = EngineShape.of(small, num_blocks=4, num_slots=1)
    assert shape.block_size == shape.hash_chain.block_size == 64
    assert (
        EngineShape.of(FLASH, num_blocks=2, num_slots=1).page_bytes
        > EngineShape.of(TINY, num_blocks=2, num_slots=1).page_bytes
    )
    with pytest.raises(ValueError):
        shape.state_layout(-1)
