"""Block KV that crosses the engine boundary as whole pages: cache hits in, full pages out.

    store --pages of a hit--> CachedPrefix --add_request--> engine (bounded SWA replay from R)
    engine --page full + chain hash--> FullPage --take_full_pages--> decode role --> store
    engine --producer rings at the last boundary--> RingSnapshot --take_ring_snapshots--> host memory
    host memory --rings of boundary H--> CachedPrefix(H, pages, rings) --> engine (exact: no replay)

Pages are in the engine format: fp32, ``[page_elems]`` each (see :mod:`dsi.kvcache.layout`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsi.model.config import ModelConfig
from dsi.model.reference import exact_hit_limit

__all__ = ["CachedPrefix", "EngineStats", "FullPage", "RequestStats", "RingSnapshot", "exact_hit_limit"]


def ring_snapshot_shape(cfg: ModelConfig) -> tuple[int, int, int, int, int]:
    """[n_producer, 2 (keys, values), snapshot_tokens, n_kv_heads, head_dim] of one SWA ring
    snapshot: V4, the producer layers' last block (128 positions); Gemma 3, every sliding
    layer's last window (512 positions for 270M)."""
    return cfg.n_producer, 2, cfg.snapshot_tokens, cfg.n_kv_heads, cfg.head_dim


@dataclass(slots=True)
class CachedPrefix:
    """The first ``num_tokens`` positions of a prompt, as the store holds them.

    num_tokens: H, a multiple of block_size, at most ``(len(prompt) - 1) // block_size`` blocks.
    pages: [H // block_size, page_elems] fp32, in chain order. The engine keeps a reference (no
    copy) until the request finishes or is exported: after a preemption it loads them again.
    rings: None for a hit with bounded SWA replay; or the producer SWA keys/values of positions
    [H - block_size, H) (a RingSnapshot's ``rings``, [n_producer, 2, block_size, n_kv_heads, D]
    fp32) for an exact hit: nothing is replayed and the output is the hit-free one. An exact hit
    needs ``H <= exact_hit_limit(len(prompt), keep, block_size)``; past it the engine raises
    InvalidRequest (use the replay path, without rings).
    """

    num_tokens: int
    pages: torch.Tensor
    rings: torch.Tensor | None = None

    @property
    def exact(self) -> bool:
        return self.rings is not None and self.num_tokens > 0


@dataclass(slots=True)
class FullPage:
    """A page of a request that became full, with its chain hash (``HashChain.hashes`` of the
    request's tokens, no cache salt). ``data``: [page_elems] fp32, a copy owned by the caller."""

    request_id: str
    index: int  # page index within the request (block i covers tokens [128 i, 128 (i + 1)))
    block_hash: bytes  # 16 bytes
    data: torch.Tensor


@dataclass(slots=True)
class RingSnapshot:
    """The producer SWA state a request reached at its last block boundary, for exact hits.

    boundary: B, a multiple of block_size; block_hash: the chain hash of the block ending at B
    (that of FullPage ``index = B // block_size - 1``); rings: the producer layers' SWA keys
    (rotated) and values of positions [B - block_size, B) in position order,
    [n_producer, 2, block_size, n_kv_heads, D] fp32, a copy owned by the caller.
    """

    request_id: str
    boundary: int
    block_hash: bytes
    rings: torch.Tensor


@dataclass(slots=True)
class RequestStats:
    """What one request cost: prompt positions loaded, replayed, and computed in all."""

    cached_tokens: int = 0
    replay_tokens: int = 0  # prompt positions in [R, H): recomputed only to rebuild SWA rings
    computed_prompt_tokens: int = 0  # prompt positions run through the model (replay included)


@dataclass(slots=True)
class EngineStats:
    """Counters since the engine started. Computed positions count work done, so a request
    preempted and recomputed counts its prompt again."""

    prompt_tokens: int = 0  # prompt positions of added requests
    cached_tokens: int = 0  # of those, loaded from a CachedPrefix
    replay_tokens: int = 0
    computed_prompt_tokens: int = 0
    full_pages: int = 0  # FullPage records queued
    ring_snapshots: int = 0  # RingSnapshot records queued
    _recent: dict[str, RequestStats] | None = None

    def record(self, request_id: str, stats: RequestStats, keep: int = 1024) -> None:
        """Remember a finished or exported request's figures (the last ``keep`` requests)."""
        if self._recent is None:
            self._recent = {}
        self._recent.pop(request_id, None)
        self._recent[request_id] = stats
        while len(self._recent) > keep:
            del self._recent[next(iter(self._recent))]

    def last_request(self, request_id: str) -> RequestStats | None:
        return (self._recent or {}).get(request_id)
