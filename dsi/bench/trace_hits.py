"""``dsi bench trace-hits``: prefix-cache hit rate of a public request trace, replayed through the
real hash chain and BlockIndex with 128-token pages, for dsi's shared store beside per-instance
local caches of the same total size.

What is compared (same requests, same total capacity in pages):

    shared    one cluster-wide store (dsi, DeepSeek's design): every prefill hits every prefix
    local4    4 instances, each with its own cache of capacity / 4; requests go round-robin in
    local16   arrival order (16: capacity / 16), the prefix-blind routing a shared store allows,
              so a request hits only what earlier requests *on its instance* left

Round-robin stands for any balancer that ignores prefixes (least-loaded routing spreads requests
alike); a prefix-affinity router would help the local caches and is not modelled.

The trace: each line has ``input_length`` and ``hash_ids``, prefix-block ids of 512 tokens, the last
one partial. Each id is expanded into 4 pages of 128 tokens whose token ids are derived from (hash
id, child index), then hashed with ``HashChain``. What counts (dsi's rules, see the README's KV
cache section):

- persisted: only full 128-token pages, written by the decode once the prompt has been prefilled,
  modelled as ``--persist-delay-s`` (default 1 s, a guess at prefill + handoff; 0, 2 and 10 s move
  the figures of the first 2,000 requests by less than 0.01) after the request's arrival, so
  requests that arrive together do not hit each other. Pages that hold generated tokens
  are persisted by dsi too, but the trace cannot say which later prompt contains them (only as
  part of its 512-token ids): they are not counted, nor are the pages of a prompt's partial last
  id that a longer prompt continues (its id there differs). Sharing finer than 512 tokens is lost.
  Both make the figures low.
- hit: the leading run of stored pages, at most ``(input_length - 1) // 128`` of them (the last
  prompt token is always computed). Hit rate = hit tokens / prompt tokens (``input_length``).
- eviction: LRU per cache at its capacity (the store's BlockIndex); capacities are the unbounded
  store and 10% and 1% of the trace's distinct pages, split evenly between local caches.

Not modelled: SWA states, which 512-token ids cannot place at page boundaries. They matter in two
ways. Under the ``bounded`` hit policy a request served by bounded replay persists no new pages
(the store holds only what a hit-free run computes); under ``exact`` a hit needs the SWA state at
its boundary. So two store figures are given, the two ends for ``bounded``:

    <layout>_hit_rate                 every request persists its full prompt pages (every hit
                                      pulled its SWA state, or none was needed); also the store
                                      of ``exact``, whose own hit rate is lower (it hits only
                                      where a state is held)
    shared_hit_rate_no_state_pulled   no SWA state is ever pulled: every hit replays, and only
                                      requests without a hit persist their pages

With an unbounded store the second is never above the first (its pages are a subset at all
times); under a capacity it can be (fewer pages, less eviction).
"""

from __future__ import annotations

import argparse
import heapq
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dsi import paths
from dsi.kvcache.hashchain import HashChain, keys_of
from dsi.kvcache.index import BlockIndex, Locations
from dsi.sim.trace import BLOCK_TOKENS, TraceRequest, block_tokens, load_trace

LAYOUTS = (("shared", 1), ("local4", 4), ("local16", 16))
CAPACITIES = (("unbounded", 0), ("10pct", 10), ("1pct", 100))  # label, 1 / fraction of distinct pages


class _TraceClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@dataclass(slots=True)
class _Persists:
    """Pages waiting to be persisted: (visible at, arrival order, instance, keys)."""

    queue: list[tuple[float, int, int, np.ndarray]] = field(default_factory=list)

    def add(self, at: float, order: int, instance: int, keys: np.ndarray) -> None:
        heapq.heappush(self.queue, (at, order, instance, keys))

    def due(self, now: float):
        while self.queue and self.queue[0][0] <= now:
            yield heapq.heappop(self.queue)[2:]


def _insert(index: BlockIndex, keys: np.ndarray) -> None:
    fresh = index.fresh(keys)
    if index.capacity:
        fresh = fresh[: index.capacity]  # a chain longer than the whole cache keeps its head
    if fresh.size:
        z = np.zeros(fresh.size, dtype=np.uint32)
        index.insert(keys[fresh], Locations(z, z.astype(np.uint64), z, z.astype(np.uint64)), 1)


def replay(
    requests: list[TraceRequest],
    chains: list[np.ndarray],
    capacity: int,
    instances: int = 1,
    persist_delay_s: float = 0.0,
    persist_after_hit: bool = True,
) -> tuple[float, int]:
    """(hit rate, distinct pages held at the end, all caches together).

    capacity: pages in all caches together (0 = unbounded), split evenly between ``instances``
    caches; request i goes to cache ``i % instances``. Its full prompt pages become visible to
    requests arriving ``persist_delay_s`` after it or later (at the same time when 0);
    ``persist_after_hit`` False: only requests without a hit persist theirs."""
    clock = _TraceClock()
    per = max(1, capacity // instances) if capacity else 0
    caches = [BlockIndex(capacity=per, clock=clock) for _ in range(instances)]
    pending = _Persists()
    hit_tokens = prompt_tokens = 0
    for i, (req, keys) in enumerate(zip(requests, chains, strict=True)):
        clock.t = req.timestamp_s
        for instance, done in pending.due(clock.t):
            _insert(caches[instance], done)
        index = caches[i % instances]
        hit = index.match_prefix(keys[: req.usable_pages], touch=True)
        hit_tokens += hit * BLOCK_TOKENS
        prompt_tokens += req.input_length
        if persist_after_hit or hit == 0:
            if persist_delay_s > 0:
                pending.add(clock.t + persist_delay_s, i, i % instances, keys)
            else:
                _insert(index, keys)
    return hit_tokens / max(prompt_tokens, 1), sum(len(c) for c in caches)


def run(trace: Path, limit: int = 0, persist_delay_s: float = 1.0) -> dict:
    start = time.perf_counter()
    requests = load_trace(trace, limit)
    chain = HashChain(root_seed=0, model="trace", block_size=BLOCK_TOKENS)
    chains = [keys_of(chain.hashes(block_tokens(r))).copy() for r in requests]
    hash_s = time.perf_counter() - start
    distinct = len(np.unique(np.concatenate(chains).view("V16"))) if chains else 0
    out: dict = {
        "requests": len(requests),
        "prompt_tokens": sum(r.input_length for r in requests),
        "distinct_pages": distinct,
        "persist_delay_s": persist_delay_s,
        "routing": "round-robin",
        "capacities": {},
    }
    for label, fraction in CAPACITIES:
        capacity = max(1, distinct // fraction) if fraction else 0
        figures: dict = {"pages": capacity}
        for name, instances in LAYOUTS:
            figures[f"{name}_hit_rate"] = round(
                replay(requests, chains, capacity, instances, persist_delay_s)[0], 4
            )
        figures["shared_hit_rate_no_state_pulled"] = round(
            replay(requests, chains, capacity, 1, persist_delay_s, persist_after_hit=False)[0], 4
        )
        out["capacities"][label] = figures
    out["hash_s"] = round(hash_s, 2)
    out["total_s"] = round(time.perf_counter() - start, 2)
    return out


def format_table(f: dict) -> str:
    head = ("capacity (pages, all caches)", "shared", "local x4", "local x16", "shared, no SWA state pulled")
    rows = [head]
    for label, c in f["capacities"].items():
        size = "unbounded" if not c["pages"] else f"{label} ({c['pages']:,})"
        rows.append(
            (
                size,
                f"{c['shared_hit_rate']:.4f}",
                f"{c['local4_hit_rate']:.4f}",
                f"{c['local16_hit_rate']:.4f}",
                f"{c['shared_hit_rate_no_state_pulled']:.4f}",
            )
        )
    width = [max(len(r[i]) for r in rows) for i in range(len(head))]
    table = "\n".join("  ".join(v.ljust(w) for v, w in zip(r, width, strict=True)).rstrip() for r in rows)
    return "\n".join(
        [
            f"requests / prompt tokens: {f['requests']:,} / {f['prompt_tokens']:,}; "
            f"distinct 128-token pages: {f['distinct_pages']:,}",
            f"hit rate = hit tokens / prompt tokens; local caches: {f['routing']} routing, capacity split evenly; "
            f"pages persisted {f['persist_delay_s']:g} s after arrival",
            table,
            f"time (s): hashing {f['hash_s']:.2f} / total {f['total_s']:.2f}",
        ]
    )


def _main(args: argparse.Namespace) -> int:
    figures = run(args.trace or paths.trace(), args.limit, args.persist_delay_s)
    print(json.dumps(figures) if args.json else format_table(figures))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "trace-hits",
        help="prefix-cache hit rate of a request trace: shared store vs "
        "per-instance caches (128-token pages)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument(
        "--trace", type=Path, default=None, help=f"JSONL trace with hash_ids (default {paths.TRACE_DEFAULT})"
    )
    parser.add_argument("--limit", type=int, default=0, help="replay only the first N requests (0 = all)")
    parser.add_argument(
        "--persist-delay-s",
        type=float,
        default=1.0,
        help="seconds from a request's arrival until its pages are in the store",
    )
    parser.set_defaults(func=_main)
