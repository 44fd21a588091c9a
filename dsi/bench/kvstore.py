"""``dsi bench kvstore``: prefix match, block I/O and index memory of the KV store, each beside its
baseline from the same run, with the same number of threads on both sides.

    (a) match     hash a 1M-token prompt (8,192 blocks) + prefix match against an index of
                  ``--index-blocks`` blocks that holds the whole prompt (the worst case: all
                  hit); hash ns/token beside a sha256 chain over the same bytes
    (b) I/O       ``--io-mib`` of 112 KiB blocks. Writes, one thread each: BlockStore puts
                  (``--batch`` blocks a call, the writer path: index + checksum + append) then an
                  fsync, beside os.write of the same bytes to one file then an fsync
                  (``write_ratio``). Reads into host shared memory, ``--read-workers`` threads
                  each: the store's read pool (checksums verified) beside raw preadv of the same
                  bytes from one file, each thread reading a contiguous share (``read_ratio``,
                  the headline: equal threads). One thread's sequential preadv of the raw file is
                  reported for scale (``raw_read_1thread_mib_s``), not compared. Every file is
                  dropped from the page cache before each read (posix_fadvise DONTNEED after an
                  fsync), so reads come from the disk; ``*_warm`` figures repeat the reads from
                  the page cache. One directory (``--dir``) holds all files; odd repeats run the
                  baselines first.
    (c) memory    index bytes per block (numpy columns + hash table) and the growth of the
                  process's resident set per block while building the index

Defaults are sized for a small shared machine (1M index blocks, 256 MiB, 3 repeats: well under a
minute); the design point is ``--index-blocks 10000000 --io-mib 1024 --repeats 5``. Figures are
medians over ``--repeats``; throughputs in MiB/s (2**20 bytes per second).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from dsi.kvcache.hashchain import HashChain, keys_of
from dsi.kvcache.index import BlockIndex, Locations
from dsi.kvcache.shm import HostBuffer
from dsi.kvcache.store import BlockStore
from dsi.model.config import FLASH
from dsi.roles.kvstore.reads import ReadPool, shm_dests

BLOCK_BYTES = 112 << 10
PROMPT_TOKENS = 1 << 20
_BUILD_CHUNK = 1 << 20


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def sha256_chain(tokens: np.ndarray, block_size: int = FLASH.block_size) -> bytes:
    data = memoryview(np.ascontiguousarray(tokens, dtype="<u4")).cast("B")
    h, size = bytes(32), 4 * block_size
    for off in range(0, len(data) - len(data) % size, size):
        h = hashlib.sha256(h + data[off : off + size]).digest()
    return h


def build_index(blocks: int, prompt_keys: np.ndarray, seed: int = 0) -> BlockIndex:
    """An index of ``blocks`` random keys, ``prompt_keys`` among them (inserted first)."""
    rng = np.random.default_rng(seed)
    index = BlockIndex(expected=blocks)
    done = 0
    while done < blocks:
        n = min(_BUILD_CHUNK, blocks - done)
        keys = rng.integers(0, 2**64, size=(n, 2), dtype=np.uint64)
        if done == 0:
            m = min(n, len(prompt_keys))
            keys[:m] = prompt_keys[:m]
        fresh = index.fresh(keys)
        z = np.zeros(len(fresh), dtype=np.uint32)
        index.insert(keys[fresh], Locations(z, z.astype(np.uint64), z + BLOCK_BYTES, z.astype(np.uint64)), 1)
        done += n
    return index


def bench_match(index_blocks: int, repeats: int) -> dict:
    tokens = np.random.default_rng(1).integers(0, 129_280, size=PROMPT_TOKENS, dtype=np.uint32)
    chain = HashChain(root_seed=0, model="bench", block_size=FLASH.block_size)
    prompt = keys_of(chain.hashes(tokens)).copy()
    rss0 = _rss()
    start = time.perf_counter()
    index = build_index(index_blocks, prompt)
    build_s = time.perf_counter() - start
    rss = _rss() - rss0
    hits = index.match_prefix(keys_of(chain.hashes(tokens)))
    match_ms = _median_ms(lambda: index.match_prefix(keys_of(chain.hashes(tokens))), repeats)
    lookup_ms = _median_ms(lambda: index.match_prefix(prompt), repeats)
    hash_ms = _median_ms(lambda: chain.hashes(tokens), repeats)
    sha_ms = _median_ms(lambda: sha256_chain(tokens), repeats)
    return {
        "index_blocks": len(index),
        "index_build_s": round(build_s, 2),
        "match_hit_blocks": hits,
        "match_ms_1m": round(match_ms, 3),
        "lookup_ms_1m": round(lookup_ms, 3),
        "hash_ns_per_token": round(hash_ms * 1e6 / PROMPT_TOKENS, 3),
        "sha256_ns_per_token": round(sha_ms * 1e6 / PROMPT_TOKENS, 3),
        "index_bytes_per_block": round(index.nbytes / len(index), 1),
        "index_rss_bytes_per_block": round(rss / len(index), 1),
    }


def _drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _raw_write(path: Path, payloads: list[bytes]) -> float:
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for p in payloads:
            os.write(fd, p)
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - start


def _raw_read_1thread(path: Path, buf: HostBuffer, n: int) -> float:
    start = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        for i in range(n):
            os.preadv(fd, [buf.view[i * BLOCK_BYTES : (i + 1) * BLOCK_BYTES]], i * BLOCK_BYTES)
    finally:
        os.close(fd)
    return time.perf_counter() - start


def _raw_read(path: Path, buf: HostBuffer, n: int, workers: int) -> float:
    """``workers`` threads, each reading its contiguous share of the file in 112 KiB preadv calls."""
    share = -(-n // workers)

    def part(first: int) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            for i in range(first, min(first + share, n)):
                os.preadv(fd, [buf.view[i * BLOCK_BYTES : (i + 1) * BLOCK_BYTES]], i * BLOCK_BYTES)
        finally:
            os.close(fd)

    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(part, range(0, n, share)))
    return time.perf_counter() - start


def _store_write(root: Path, hashes: bytes, payloads: list[bytes], batch: int) -> float:
    start = time.perf_counter()
    store = BlockStore(root, segment_bytes=1 << 30, fsync="segment")
    for i in range(0, len(payloads), batch):
        store.put(hashes[i * 16 : (i + batch) * 16], payloads[i : i + batch])
    store.close()  # fsyncs the active segment
    return time.perf_counter() - start


def _store_read(store: BlockStore, hashes: bytes, buf: HostBuffer, workers: int) -> float:
    """Seconds to read every block into ``buf`` through a ReadPool (the pool's start not timed)."""

    async def read() -> float:
        pool = ReadPool(workers, max_inflight=workers * 8)
        start = time.perf_counter()
        plan = store.read_plan(hashes)
        status = await pool.read(plan, shm_dests(buf, plan, 0, BLOCK_BYTES))
        store.read_finish(plan, status)
        elapsed = time.perf_counter() - start
        pool.close()
        return elapsed

    hits = store.metrics.hits
    elapsed = asyncio.run(read())
    if store.metrics.hits - hits != len(hashes) // 16:
        raise RuntimeError(f"read back {store.metrics.hits - hits} of {len(hashes) // 16} blocks")
    return elapsed


def _reads(
    store: BlockStore, raw: Path, hashes: bytes, buf: HostBuffer, workers: int, cold: bool, raw_first: bool
) -> dict[str, float]:
    """MiB/s of the store's read (``workers`` threads), the raw read with as many threads and the
    raw read with one thread, of the same bytes; cold = every file dropped from the page cache
    before each read."""
    n = len(hashes) // 16
    mib = n * BLOCK_BYTES / (1 << 20)

    def drop() -> None:
        if cold:
            _drop_cache(raw)
            for seg in store.root.glob("*.kv"):
                _drop_cache(seg)

    if not cold:  # bring every file into the page cache first
        _raw_read(raw, buf, n, workers)
        _store_read(store, hashes, buf, workers)

    out = {}
    order = ("raw", "raw_1thread", "store") if raw_first else ("store", "raw", "raw_1thread")
    for which in order:
        drop()
        if which == "store":
            out[which] = mib / _store_read(store, hashes, buf, workers)
        elif which == "raw":
            out[which] = mib / _raw_read(raw, buf, n, workers)
        else:
            out[which] = mib / _raw_read_1thread(raw, buf, n)
    return out


def bench_io(io_mib: int, batch: int, workers: int, repeats: int, where: Path) -> dict:
    n = max(1, (io_mib << 20) // BLOCK_BYTES)
    rng = np.random.default_rng(2)
    payloads = [rng.integers(0, 256, size=BLOCK_BYTES, dtype=np.uint8).tobytes() for _ in range(n)]
    hashes = HashChain.of(FLASH).hashes(rng.integers(0, 129_280, size=FLASH.block_size * n, dtype=np.uint32))
    mib = n * BLOCK_BYTES / (1 << 20)
    runs: dict[str, list[float]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="dsi-bench-kvstore-", dir=where))
    try:
        with HostBuffer.create(n * BLOCK_BYTES) as buf:
            for r in range(repeats):  # odd repeats run the baselines first
                raw, store_dir = tmp / "raw.bin", tmp / "store"
                for key in ("raw_write", "write") if r % 2 else ("write", "raw_write"):
                    if key == "write":
                        seconds = _store_write(store_dir, hashes, payloads, batch)
                    else:
                        seconds = _raw_write(raw, payloads)
                    runs.setdefault(key, []).append(mib / seconds)
                store = BlockStore(store_dir)  # the rebuild reads headers: before the caches drop
                for suffix, cold in (("", True), ("_warm", False)):
                    got = _reads(store, raw, hashes, buf, workers, cold, raw_first=bool(r % 2))
                    runs.setdefault(f"read{suffix}", []).append(got["store"])
                    runs.setdefault(f"raw_read{suffix}", []).append(got["raw"])
                    runs.setdefault(f"raw_read_1thread{suffix}", []).append(got["raw_1thread"])
                store.close()
                raw.unlink()
                shutil.rmtree(store_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out = {f"{k}_mib_s": round(statistics.median(v), 1) for k, v in runs.items()}
    out["write_ratio"] = round(out["write_mib_s"] / out["raw_write_mib_s"], 3)  # 1 thread : 1 thread
    out["read_ratio"] = round(out["read_mib_s"] / out["raw_read_mib_s"], 3)  # workers : workers threads
    out["read_ratio_warm"] = round(out["read_warm_mib_s"] / out["raw_read_warm_mib_s"], 3)
    out["read_threads"] = workers
    out["io_blocks"] = n
    return out


def run(
    index_blocks: int = 1_000_000,
    io_mib: int = 256,
    batch: int = 32,
    read_workers: int = 8,
    repeats: int = 3,
    where: Path | None = None,
) -> dict:
    figures = bench_match(index_blocks, repeats)
    figures.update(bench_io(io_mib, batch, read_workers, repeats, where or Path(tempfile.gettempdir())))
    figures["repeats"] = repeats
    return figures


def format_table(f: dict) -> str:
    threads = f"{f['read_threads']} thread" + ("s" if f["read_threads"] != 1 else "")
    rows = [
        ("", "dsi", "baseline", "ratio / target"),
        (
            f"match 1M tokens vs {f['index_blocks']:,} blocks (ms)",
            f"{f['match_ms_1m']:.2f}",
            f"lookup only {f['lookup_ms_1m']:.2f}",
            "target < 5",
        ),
        (
            "hash chain (ns/token)",
            f"{f['hash_ns_per_token']:.2f}",
            f"sha256 {f['sha256_ns_per_token']:.2f}",
            f"{f['sha256_ns_per_token'] / f['hash_ns_per_token']:.1f}x faster",
        ),
        (
            "write 112 KiB blocks, 1 thread each (MiB/s)",
            f"{f['write_mib_s']:.0f}",
            f"raw {f['raw_write_mib_s']:.0f}",
            f"{f['write_ratio']:.2f} (target >= 0.70)",
        ),
        (
            f"read 112 KiB blocks, cold, {threads} each (MiB/s)",
            f"{f['read_mib_s']:.0f}",
            f"raw {f['raw_read_mib_s']:.0f}",
            f"{f['read_ratio']:.2f} (target >= 0.70)",
        ),
        ("  raw with 1 thread, for scale", "", f"raw {f['raw_read_1thread_mib_s']:.0f}", ""),
        (
            f"read 112 KiB blocks, page cache, {threads} each (MiB/s)",
            f"{f['read_warm_mib_s']:.0f}",
            f"raw {f['raw_read_warm_mib_s']:.0f}",
            f"{f['read_ratio_warm']:.2f} (checksums cost here)",
        ),
        (
            "index bytes per block",
            f"{f['index_bytes_per_block']:.0f}",
            f"rss {f['index_rss_bytes_per_block']:.0f}",
            "target <= 200",
        ),
        ("index build (s)", f"{f['index_build_s']:.1f}", "", ""),
    ]
    width = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, width, strict=True)).rstrip() for r in rows)


def _main(args: argparse.Namespace) -> int:
    figures = run(args.index_blocks, args.io_mib, args.batch, args.read_workers, args.repeats, args.dir)
    print(json.dumps(figures) if args.json else format_table(figures))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("kvstore", help="KV store: prefix match, block I/O vs raw files, index memory")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument(
        "--index-blocks",
        type=int,
        default=1_000_000,
        help="blocks in the matched index (design point: 10000000)",
    )
    parser.add_argument("--io-mib", type=int, default=256, help="MiB of 112 KiB blocks written and read")
    parser.add_argument("--batch", type=int, default=32, help="blocks per store put")
    parser.add_argument(
        "--read-workers",
        type=int,
        default=8,
        help="threads of the store's read pool, and of the raw read it is compared with",
    )
    parser.add_argument("--repeats", type=int, default=3, help="repeats; figures are medians")
    parser.add_argument("--dir", type=Path, default=None, help="directory for the I/O files (default: temp)")
    parser.set_defaults(func=_main)
