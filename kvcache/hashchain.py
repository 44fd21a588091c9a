"""Block hash chain: one 128-bit ``BlockHash`` per full block (``B = block_size`` tokens) of a prompt.

    root   = xxh3_128(root_seed, model, version, cache salt)          one per request
    h[0]   = xxh3_128(root  || tokens[0:B]   (|| extra[0]))
    h[i]   = xxh3_128(h[i-1] || tokens[B i:B (i+1)] (|| extra[i]))

The block size is the model's (``ModelConfig.block_size``, 128 for the V4 family): a block hash
names one Block KV page, so the chain takes it from the model config (``HashChain.of``) and
never has its own. Token ids are hashed as little-endian uint32 (``4 B`` bytes per block). ``extra[i]`` holds the extra
keys that belong to block i (the hashes of the images whose placeholder tokens it covers); the
input length differs from a block without extras, so the two can never be confused. A partial
last block is never hashed: only full blocks are cached.

The root seed is fixed cluster-wide (``cluster.root_seed``) because the store outlives every
process: a hash computed today must find the block persisted last week. Hashes of one prompt
travel packed: ``n x 16`` bytes in chain order (see ``keys_of`` for the numpy view the index
uses). The loop does one xxh3 call per block (about 1.6 ns per token, 8,192 blocks of a
1M-token prompt in under 2 ms).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import xxhash

if TYPE_CHECKING:
    from dsi.model.config import ModelConfig

HASH_BYTES = 16

BlockHash = bytes
"""16 bytes: one block's position in one prompt's prefix chain."""


@dataclass(slots=True, frozen=True)
class HashChain:
    """Hashes prompts for one model; ``root_seed`` comes from ``cluster.root_seed``,
    ``block_size`` (tokens per hashed block) from the model config."""

    root_seed: int = 0
    model: str = ""
    version: str = ""
    block_size: int = field(kw_only=True)

    def __post_init__(self) -> None:
        if not 0 <= self.root_seed < 2**64:
            raise ValueError(f"root_seed must fit in 64 bits, got {self.root_seed}")
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"block_size must be a positive number of tokens, got {self.block_size!r}")

    @classmethod
    def of(cls, model: ModelConfig, root_seed: int = 0) -> HashChain:
        """The chain of ``model``'s pages: what the engine hashes and the entrypoint matches."""
        return cls(root_seed, model.name, block_size=model.block_size)

    def root(self, cache_salt: str = "") -> BlockHash:
        """The parent of block 0: different salts (tenants) or models never share a block."""
        parts = [self.model, self.version, cache_salt]
        text = b"\x00".join(p.encode() for p in parts)
        return xxhash.xxh3_128_digest(b"dsi-kv-root\x00" + text, seed=self.root_seed)

    def hashes(
        self,
        tokens: Sequence[int] | np.ndarray,
        *,
        cache_salt: str = "",
        extras: Mapping[int, bytes] | None = None,
        parent: BlockHash | None = None,
    ) -> bytes:
        """Packed hashes (``full_blocks x 16`` bytes) of the full blocks of ``tokens``.

        ``parent`` continues a chain (the hash of the block before ``tokens[0]``); by default the
        chain starts at ``root(cache_salt)``. ``extras`` maps a block index to its extra keys.
        """
        ids = np.ascontiguousarray(tokens, dtype="<u4")
        full = ids.size // self.block_size
        start = self.root(cache_salt) if parent is None else parent
        if len(start) != HASH_BYTES:
            raise ValueError(f"a parent BlockHash has {HASH_BYTES} bytes, got {len(start)}")
        data = memoryview(ids[: full * self.block_size]).cast("B")
        if extras:
            return _chain_with_extras(data, self.block_size * 4, start, extras)
        return _chain(data, self.block_size * 4, start)


def _chain(data: memoryview, block_bytes: int, parent: bytes) -> bytes:
    digest = xxhash.xxh3_128_digest
    out: list[bytes] = []
    append = out.append
    h = parent
    for off in range(0, len(data), block_bytes):
        h = digest(h + data[off : off + block_bytes])
        append(h)
    return b"".join(out)


def _chain_with_extras(
    data: memoryview, block_bytes: int, parent: bytes, extras: Mapping[int, bytes]
) -> bytes:
    digest = xxhash.xxh3_128_digest
    out: list[bytes] = []
    h = parent
    for i, off in enumerate(range(0, len(data), block_bytes)):
        h = digest(h + data[off : off + block_bytes] + extras.get(i, b""))
        out.append(h)
    return b"".join(out)


def keys_of(packed: bytes | bytearray | memoryview) -> np.ndarray:
    """Packed hashes -> ``[n, 2]`` uint64 keys (a view, no copy): what the index stores."""
    if len(packed) % HASH_BYTES:
        raise ValueError(f"packed hashes must be a multiple of {HASH_BYTES} bytes, got {len(packed)}")
    return np.frombuffer(packed, dtype="<u8").reshape(-1, 2)


def pack(hashes: Sequence[BlockHash]) -> bytes:
    """A list of 16-byte hashes -> packed bytes (checks each length)."""
    for h in hashes:
        if len(h) != HASH_BYTES:
            raise ValueError(f"a BlockHash has {HASH_BYTES} bytes, got {len(h)}")
    return b"".join(hashes)


def unpack(packed: bytes) -> list[BlockHash]:
    """Packed hashes -> list of 16-byte ``BlockHash``."""
    keys_of(packed)  # length check
    return [bytes(packed[i : i + HASH_BYTES]) for i in range(0, len(packed), HASH_BYTES)]


def image_extras(images: Sequence[tuple[int, int, bytes]], block_size: int) -> dict[int, bytes]:
    """The extra keys of a prompt's blocks from its images: ``images`` are (offset, tokens,
    digest) with the image's placeholder tokens at positions [offset, offset + tokens); block i
    gets the digests of the images whose tokens it covers, in prompt order. So the same image at
    the same place hashes the same, and a different image changes the chain from the first block
    it covers on: nothing past it can hit.

    >>> image_extras([(100, 64, b"A" * 16)], 128)
    {0: b'AAAAAAAAAAAAAAAA', 1: b'AAAAAAAAAAAAAAAA'}
    """
    extras: dict[int, bytes] = {}
    for offset, tokens, digest in images:
        if tokens <= 0:
            continue
        for block in range(offset // block_size, (offset + tokens - 1) // block_size + 1):
            extras[block] = extras.get(block, b"") + digest
    return extras
