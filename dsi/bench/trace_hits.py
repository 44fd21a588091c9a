"""``dsi bench trace-hits``: prefix-cache hit rate of a public request trace, replayed through the
real hash chain and BlockIndex with the blocks of the full-size model (``FLASH.block_size``, 128).

Each trace line has ``hash_ids``: prefix-block ids of 512 tokens (the last one partial). Block ids
are expanded into 512 / B blocks of B tokens whose token ids are derived from (hash id, child
index), then hashed with ``HashChain``; a partial last id gives only its full B-token children.
Requests are replayed in timestamp order, the trace's clock driving the index clock:

    hit = index.match_prefix(chain, touch=True)      hit tokens += B * hit
    index.insert(the chain's blocks not held)        (capacity eviction: LRU)

Hit rate = hit tokens / prompt tokens (``input_length``), for an unbounded index and for
capacities of 10% and 1% of the trace's distinct blocks. Only prompt blocks are inserted: the
trace does not say which blocks the generated tokens would fill (later turns' prompts, which
contain them, are in the trace). Sharing finer than 512 tokens cannot be recovered from it.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dsi.kvcache.hashchain import HashChain, keys_of
from dsi.kvcache.index import BlockIndex, Locations
from dsi.model.config import FLASH

TRACE_BLOCK = 512
DEFAULT_TRACE = Path("../shared/data/traces/mooncake_conversation_trace.jsonl")
_REPO = Path(__file__).resolve().parents[2]


@dataclass(slots=True, frozen=True)
class TraceRequest:
    timestamp_s: float
    input_length: int
    hash_ids: tuple[int, ...]


def load_trace(path: Path, limit: int = 0) -> list[TraceRequest]:
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                out.append(TraceRequest(row["timestamp"] / 1000.0, row["input_length"], tuple(row["hash_ids"])))
                if limit and len(out) >= limit:
                    break
    out.sort(key=lambda r: r.timestamp_s)
    return out


def block_tokens(req: TraceRequest, block_size: int) -> np.ndarray:
    """``[full_blocks * block_size]`` synthetic token ids: ``512 / block_size`` children per
    512-token id, the partial last id cut to its full children."""
    if TRACE_BLOCK % block_size or block_size < 4:
        raise ValueError(f"block_size {block_size} must divide the trace's {TRACE_BLOCK}-token blocks")
    children = TRACE_BLOCK // block_size
    ids = np.asarray(req.hash_ids, dtype=np.uint64)
    full = min(len(ids) * children, req.input_length // block_size)
    blocks = np.zeros((len(ids) * children, block_size), dtype=np.uint32)
    blocks[:, 0] = np.repeat(ids & np.uint64(0xFFFFFFFF), children).astype(np.uint32)
    blocks[:, 1] = np.repeat(ids >> np.uint64(32), children).astype(np.uint32)
    blocks[:, 2] = np.tile(np.arange(children, dtype=np.uint32), len(ids))
    blocks[:, 3] = 0x5EED  # marks synthetic blocks
    return blocks[:full].reshape(-1)


class _TraceClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def replay(requests: list[TraceRequest], chains: list[np.ndarray], capacity: int,
           block_size: int) -> tuple[float, int]:
    """(hit rate, distinct blocks held at the end) for one capacity (0 = unbounded)."""
    clock = _TraceClock()
    index = BlockIndex(capacity=capacity, clock=clock)
    hit_tokens = prompt_tokens = 0
    for req, keys in zip(requests, chains, strict=True):
        clock.t = req.timestamp_s
        hit = index.match_prefix(keys, touch=True)
        hit_tokens += hit * block_size
        prompt_tokens += req.input_length
        fresh = index.fresh(keys)
        if capacity:
            fresh = fresh[:capacity]  # a chain longer than the whole cache keeps its head
        if fresh.size:
            z = np.zeros(fresh.size, dtype=np.uint32)
            index.insert(keys[fresh], Locations(z, z.astype(np.uint64), z, z.astype(np.uint64)), 1)
    return hit_tokens / max(prompt_tokens, 1), len(index)


def run(trace: Path, limit: int = 0) -> dict:
    start = time.perf_counter()
    requests = load_trace(trace, limit)
    chain = HashChain(root_seed=0, model="trace", block_size=FLASH.block_size)
    bs = chain.block_size
    chains = [keys_of(chain.hashes(block_tokens(r, bs))).copy() for r in requests]
    hash_s = time.perf_counter() - start
    unbounded, distinct = replay(requests, chains, 0, bs)
    out = {
        "block_size": bs,
        "requests": len(requests),
        "prompt_tokens": sum(r.input_length for r in requests),
        "distinct_blocks": distinct,
        "hit_rate_unbounded": round(unbounded, 4),
    }
    for label, fraction in (("10pct", 10), ("1pct", 100)):
        capacity = max(1, distinct // fraction)
        out[f"capacity_{label}"] = capacity
        out[f"hit_rate_{label}"] = round(replay(requests, chains, capacity, bs)[0], 4)
    out["hash_s"] = round(hash_s, 2)
    out["total_s"] = round(time.perf_counter() - start, 2)
    return out


def resolve(trace: Path) -> Path:
    """The trace as given, else relative to the repository root (where CI has ../shared)."""
    if trace.exists() or trace.is_absolute():
        return trace
    return _REPO / trace


def format_table(f: dict) -> str:
    rows = [
        ("requests / prompt tokens", f"{f['requests']:,} / {f['prompt_tokens']:,}"),
        (f"distinct {f['block_size']}-token blocks", f"{f['distinct_blocks']:,}"),
        ("hit rate, unbounded", f"{f['hit_rate_unbounded']:.4f}"),
        (f"hit rate, capacity 10% ({f['capacity_10pct']:,} blocks)", f"{f['hit_rate_10pct']:.4f}"),
        (f"hit rate, capacity 1% ({f['capacity_1pct']:,} blocks)", f"{f['hit_rate_1pct']:.4f}"),
        ("time (s): hashing / total", f"{f['hash_s']:.2f} / {f['total_s']:.2f}"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows)


def _main(args: argparse.Namespace) -> int:
    figures = run(resolve(args.trace), args.limit)
    print(json.dumps(figures) if args.json else format_table(figures))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("trace-hits", help="prefix-cache hit rate of a request trace (the model's blocks)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="JSONL trace with hash_ids")
    parser.add_argument("--limit", type=int, default=0, help="replay only the first N requests (0 = all)")
    parser.set_defaults(func=_main)
