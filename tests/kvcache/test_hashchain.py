"""Block hash chain: full blocks only, parent chaining, extra keys, salts, the fixed root seed."""

import numpy as np
import pytest
import xxhash

from dsi.kvcache.hashchain import HASH_BYTES, HashChain, keys_of, pack, unpack
from dsi.model.config import TINY, ModelConfig

BS = 128  # the V4 family's block size


def tokens(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 129_280, size=n, dtype=np.uint32)


def test_only_full_blocks_are_hashed_and_each_is_16_bytes():
    chain = HashChain(root_seed=7, block_size=BS)
    assert len(chain.hashes(tokens(127))) == 0
    assert len(chain.hashes(tokens(128))) == HASH_BYTES
    assert len(chain.hashes(tokens(300))) == 2 * HASH_BYTES


def test_matches_the_documented_definition():
    chain = HashChain(root_seed=3, model="dsi-tiny", version="1", block_size=BS)
    ids = tokens(256)
    root = xxhash.xxh3_128_digest(b"dsi-kv-root\x00dsi-tiny\x001\x00salt", seed=3)
    h0 = xxhash.xxh3_128_digest(root + ids[:128].astype("<u4").tobytes())
    h1 = xxhash.xxh3_128_digest(h0 + ids[128:].astype("<u4").tobytes())
    assert unpack(chain.hashes(ids, cache_salt="salt")) == [h0, h1]


def test_prefix_sharing_and_divergence():
    chain = HashChain(block_size=BS)
    a = tokens(128 * 4)
    b = a.copy()
    b[128 * 2 + 5] += 1  # differs inside block 2
    ha, hb = unpack(chain.hashes(a)), unpack(chain.hashes(b))
    assert ha[:2] == hb[:2] and ha[2] != hb[2] and ha[3] != hb[3]
    # A list of ints hashes like the uint32 array.
    assert chain.hashes(a.tolist()) == chain.hashes(a)


def test_parent_continues_a_chain():
    chain = HashChain(root_seed=1, block_size=BS)
    ids = tokens(128 * 5)
    whole = unpack(chain.hashes(ids))
    tail = unpack(chain.hashes(ids[256:], parent=whole[1]))
    assert tail == whole[2:]


def test_salt_model_seed_and_extras_separate_chains():
    ids = tokens(256)
    base = HashChain(root_seed=0, model="m", version="1", block_size=BS).hashes(ids)
    assert HashChain(root_seed=1, model="m", version="1", block_size=BS).hashes(ids) != base
    assert HashChain(root_seed=0, model="m", version="2", block_size=BS).hashes(ids) != base
    assert (
        HashChain(root_seed=0, model="m", version="1", block_size=BS).hashes(ids, cache_salt="tenant") != base
    )
    with_image = unpack(HashChain(0, "m", "1", block_size=BS).hashes(ids, extras={1: b"image-hash"}))
    assert with_image[0] == unpack(base)[0] and with_image[1] != unpack(base)[1]


def test_packing_helpers_check_lengths():
    packed = HashChain(block_size=BS).hashes(tokens(384))
    keys = keys_of(packed)
    assert keys.shape == (3, 2) and keys.dtype == np.uint64
    assert pack(unpack(packed)) == packed
    with pytest.raises(ValueError):
        keys_of(b"x" * 17)
    with pytest.raises(ValueError):
        pack([b"short"])
    with pytest.raises(ValueError):
        HashChain(root_seed=-1, block_size=BS)


def test_the_block_size_is_the_model_configs():
    ids = tokens(256)
    small = ModelConfig(name="small-blocks", block_size=64)
    assert HashChain.of(TINY, 3) == HashChain(3, "tiny", block_size=TINY.block_size)
    packed = HashChain.of(small).hashes(ids)
    assert len(packed) == 4 * HASH_BYTES  # 64-token blocks
    root = HashChain.of(small).root()
    assert unpack(packed)[0] == xxhash.xxh3_128_digest(root + ids[:64].astype("<u4").tobytes())
    with pytest.raises(TypeError):
        HashChain(0, "m")  # no default block size: it comes from the model
    with pytest.raises(ValueError):
        HashChain(block_size=0)


def test_image_extras_name_every_block_an_image_covers():
    from dsi.kvcache.hashchain import image_extras

    a, b = b"A" * 16, b"B" * 16
    assert image_extras([(100, 64, a)], 128) == {0: a, 1: a}
    assert image_extras([(0, 10, a), (20, 5, b), (128, 128, b)], 128) == {0: a + b, 1: b}
    chain = HashChain(block_size=4)
    tokens = list(range(12))
    plain = chain.hashes(tokens)
    mixed = chain.hashes(tokens, extras=image_extras([(5, 2, a)], 4))
    assert plain[:16] == mixed[:16] and plain[16:32] != mixed[16:32] and plain[32:] != mixed[32:]
