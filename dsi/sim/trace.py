"""The Mooncake traces (found by :func:`dsi.paths.trace`) as simulated requests.

Each line: ``{"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [...]}``;
``hash_ids`` are prefix-block ids of 512 tokens, the last one partial. Each id is expanded into
4 pages of 128 tokens whose token ids are derived from (hash id, child index) and hashed with
the real ``HashChain``, so two requests that share their first k ids share their first 4 k
pages. Sharing finer than 512 tokens cannot be recovered from the trace, and the trace does not
say which later prompt holds a request's output: ``persist_keys`` are the prompt's pages only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dsi.kvcache.hashchain import HashChain, keys_of
from dsi.model.config import FLASH
from dsi.sim.workload import SimRequest

TRACE_BLOCK = 512  # tokens per trace hash id
BLOCK_TOKENS = FLASH.block_size  # the full-size model's pages
CHILDREN = TRACE_BLOCK // BLOCK_TOKENS


@dataclass(slots=True, frozen=True)
class TraceRequest:
    timestamp_s: float
    input_length: int
    hash_ids: tuple[int, ...]
    output_length: int = 0

    @property
    def usable_pages(self) -> int:
        """Pages a hit may cover: the last prompt token is always computed."""
        return max(0, self.input_length - 1) // BLOCK_TOKENS


def load_trace(path: Path, limit: int = 0) -> list[TraceRequest]:
    """The first ``limit`` lines (0 = all) of a trace, sorted by timestamp (stable)."""
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                out.append(
                    TraceRequest(
                        row["timestamp"] / 1000.0,
                        row["input_length"],
                        tuple(row["hash_ids"]),
                        int(row.get("output_length", 0)),
                    )
                )
                if limit and len(out) >= limit:
                    break
    out.sort(key=lambda r: r.timestamp_s)
    return out


def block_tokens(req: TraceRequest) -> np.ndarray:
    """``[full_pages * 128]`` synthetic token ids: 4 children per 512-token id, the partial last
    id cut to its full 128-token children."""
    ids = np.asarray(req.hash_ids, dtype=np.uint64)
    full = min(len(ids) * CHILDREN, req.input_length // BLOCK_TOKENS)
    blocks = np.zeros((len(ids) * CHILDREN, BLOCK_TOKENS), dtype=np.uint32)
    blocks[:, 0] = np.repeat(ids & np.uint64(0xFFFFFFFF), CHILDREN).astype(np.uint32)
    blocks[:, 1] = np.repeat(ids >> np.uint64(32), CHILDREN).astype(np.uint32)
    blocks[:, 2] = np.tile(np.arange(CHILDREN, dtype=np.uint32), len(ids))
    blocks[:, 3] = 0x5EED  # marks synthetic blocks
    return blocks[:full].reshape(-1)


def trace_workload(path: Path, limit: int = 0, traffic_class: str = "chatbot") -> list[SimRequest]:
    """The trace's requests, keys hashed with the real chain (root seed 0, model "trace")."""
    chain = HashChain(root_seed=0, model="trace", block_size=BLOCK_TOKENS)
    out = []
    for i, row in enumerate(load_trace(path, limit)):
        keys = keys_of(chain.hashes(block_tokens(row)))
        out.append(
            SimRequest(
                id=i,
                arrival_s=row.timestamp_s,
                prompt_tokens=max(1, row.input_length),
                output_tokens=max(1, row.output_length),
                keys=keys,
                persist_keys=keys,
                traffic_class=traffic_class,
            )
        )
    return out
