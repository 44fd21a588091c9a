"""``dsi bench kv-transfer``: the KV data plane between two processes, beside a plain memcpy.

Two cases, each a full transfer timed at the sender from ``send`` to the receiver's confirmation::

    blocks   1,000 KV blocks of 112 KiB, passed as 1,000 parts (one prefill's KV for one request)
    buffer   one 64 MiB buffer

Backends: ``shm``, ``tcp`` and ``tcp_encrypted`` (dsi, receiver in a child process; the last is
the same tcp plane with CURVE keys, a key set made for the run: one handshake per connection, then
AES-256-GCM on every chunk), ``memcpy`` (numpy copyto of the same parts into a warm buffer in this
process: the bound shm can approach), and Mooncake's TCP transport when it is installed
(``mooncake_tcp``, receiver in its own process). Within a repeat the backends take turns, so all
see the same load on a shared machine; each figure is the median over repeats, in Gbit/s (1e9
bits per second). Headline figures count both cases together: their bytes over the sum of their
median times. ``shm_ratio``/``tcp_ratio`` are against ``memcpy``; ``encrypted_ratio`` is
``tcp_encrypted`` against ``tcp``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import statistics
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import uvloop

from dsi.bench.kv_mooncake import MooncakeTcp, unavailable
from dsi.transport.kv import DataPlane, Inbound, KvTarget, make_data_plane
from dsi.transport.security import CurveKeys, generate_keys

_DSI = {"shm": "shm", "tcp": "tcp", "tcp_encrypted": "tcp"}  # figure name -> backend
_WAIT_S = 60.0
_TIMEOUT_S = 120.0


# ---- receiver process ---------------------------------------------------------------------------
def _receiver_main(conn: Connection, key_files: dict[str, Path]) -> None:
    uvloop.run(_receive(conn, _keys(key_files)))


def _keys(files: dict[str, Path]) -> CurveKeys:
    """The run's keys, as a node's ``[security]`` loads them (every process here sends and receives)."""
    return CurveKeys.load(
        files["server_public"],
        files["client_secret"],
        server_secret_key=files["server_secret"],
        authorized_keys_dir=files["authorized_dir"],
    )


def _planes(keys: CurveKeys) -> dict[str, DataPlane]:
    return {
        name: make_data_plane(backend, keys=keys if name == "tcp_encrypted" else None)
        for name, backend in _DSI.items()
    }


async def _receive(conn: Connection, keys: CurveKeys) -> None:
    """Expects what the sender asks for over the pipe, answers with the target, releases when done."""
    planes = _planes(keys)
    for plane in planes.values():
        await plane.start()
    stopped = asyncio.Event()
    tasks: set[asyncio.Task] = set()

    async def settle(inbound: Inbound) -> None:
        try:
            await inbound.wait()
        finally:
            inbound.release()

    def on_pipe() -> None:
        request = conn.recv()
        if request is None:
            stopped.set()
            return
        name, transfer_id, nbytes = request
        inbound = planes[name].expect(transfer_id, nbytes, _TIMEOUT_S)
        conn.send_bytes(msgspec.msgpack.encode(inbound.target))
        task = asyncio.create_task(settle(inbound))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    asyncio.get_running_loop().add_reader(conn.fileno(), on_pipe)
    conn.send("ready")
    await stopped.wait()
    for plane in planes.values():
        await plane.close()


# ---- sender (this process) ----------------------------------------------------------------------
class _Receiver:
    def __init__(self, key_files: dict[str, Path]) -> None:
        mp = multiprocessing.get_context("spawn")
        self._conn, there = mp.Pipe()
        self.process = mp.Process(target=_receiver_main, args=(there, key_files), daemon=True)
        self.process.start()
        there.close()
        if not self._conn.poll(_WAIT_S):
            self.stop()
            raise RuntimeError(f"the receiver process did not start in {_WAIT_S}s")
        self._conn.recv()
        self._count = 0

    def expect(self, name: str, nbytes: int) -> KvTarget:
        self._count += 1
        self._conn.send((name, f"t{self._count}", nbytes))
        return msgspec.msgpack.decode(self._conn.recv_bytes(), type=KvTarget)

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self._conn.send(None)
        self.process.join(10.0)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def _cases(blocks: int, block_bytes: int, buffer_bytes: int) -> dict[str, list[np.ndarray]]:
    rng = np.random.default_rng(0)
    source = rng.integers(0, 256, blocks * block_bytes, dtype=np.uint8)
    return {
        "blocks": [source[i * block_bytes : (i + 1) * block_bytes] for i in range(blocks)],
        "buffer": [rng.integers(0, 256, buffer_bytes, dtype=np.uint8)],
    }


async def _time_dsi(name: str, plane: DataPlane, receiver: _Receiver, parts: list[np.ndarray]) -> float:
    target = receiver.expect(name, sum(p.nbytes for p in parts))
    started = time.perf_counter()
    await plane.send(target, parts, _TIMEOUT_S)
    return time.perf_counter() - started


def _time_memcpy(parts: list[np.ndarray], destination: np.ndarray) -> float:
    started = time.perf_counter()
    at = 0
    for part in parts:
        np.copyto(destination[at : at + part.nbytes], part)
        at += part.nbytes
    return time.perf_counter() - started


def _time_call(call: Callable[[], None]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


async def _measure(
    cases: dict[str, list[np.ndarray]], repeats: int, mooncake: MooncakeTcp | None, key_files: dict[str, Path]
) -> dict[str, Any]:
    receiver = _Receiver(key_files)
    planes = _planes(_keys(key_files))
    for plane in planes.values():
        await plane.start()
    destination = np.ones(max(sum(p.nbytes for p in parts) for parts in cases.values()), np.uint8)
    seconds: dict[str, dict[str, list[float]]] = {case: {} for case in cases}
    try:
        for repeat in range(repeats + 1):  # the first round warms pools, mappings and connections
            for case, parts in cases.items():
                times = {
                    name: await _time_dsi(name, plane, receiver, parts) for name, plane in planes.items()
                }
                times["memcpy"] = _time_memcpy(parts, destination)
                if mooncake is not None:
                    times["mooncake_tcp"] = _time_call(lambda p=parts: mooncake.write(p))
                if repeat:
                    for name, s in times.items():
                        seconds[case].setdefault(name, []).append(s)
    finally:
        for plane in planes.values():
            await plane.close()
        receiver.stop()
    return seconds


def _figures(
    cases: dict[str, list[np.ndarray]], seconds: dict[str, dict[str, list[float]]]
) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    total_bytes = sum(sum(p.nbytes for p in parts) for parts in cases.values())
    medians = {
        case: {name: statistics.median(s) for name, s in times.items()} for case, times in seconds.items()
    }
    for case, parts in cases.items():
        nbytes = sum(p.nbytes for p in parts)
        for name, median in medians[case].items():
            figures[f"{case}_{name}_gbps"] = nbytes * 8 / median / 1e9
    for name in medians["buffer"]:
        figures[f"{name}_gbps"] = total_bytes * 8 / sum(m[name] for m in medians.values()) / 1e9
    figures["shm_ratio"] = figures["shm_gbps"] / figures["memcpy_gbps"]
    figures["tcp_ratio"] = figures["tcp_gbps"] / figures["memcpy_gbps"]
    figures["encrypted_ratio"] = figures["tcp_encrypted_gbps"] / figures["tcp_gbps"]
    return figures


def run(
    blocks: int = 1000, block_kib: int = 112, buffer_mib: int = 64, repeats: int = 5, mooncake: bool = True
) -> dict[str, Any]:
    """Measure every backend on both cases; every child process is stopped before this returns."""
    if blocks < 1 or block_kib < 1 or buffer_mib < 1 or repeats < 1:
        raise ValueError("blocks, block_kib, buffer_mib and repeats must be positive")
    cases = _cases(blocks, block_kib << 10, buffer_mib << 20)
    reason = unavailable() if mooncake else "disabled with --no-mooncake"
    baseline: MooncakeTcp | None = None
    try:
        if reason is None:
            baseline = MooncakeTcp(max(sum(p.nbytes for p in parts) for parts in cases.values()))
            for parts in cases.values():
                baseline.register(parts[0].base if parts[0].base is not None else parts[0])
        with tempfile.TemporaryDirectory(prefix="dsi-bench-keys-") as folder:
            key_files = generate_keys(Path(folder) / "keys")
            seconds = uvloop.run(_measure(cases, repeats, baseline, key_files))
    finally:
        if baseline is not None:
            baseline.close()
    figures = _figures(cases, seconds)
    figures.setdefault("mooncake_tcp_gbps", None)
    figures["mooncake_reason"] = reason
    figures.update(blocks=blocks, block_kib=block_kib, buffer_mib=buffer_mib, repeats=repeats)
    return figures


# ---- command line -------------------------------------------------------------------------------
def format_table(f: dict[str, Any]) -> str:
    def gbps(key: str) -> str:
        return "-" if f.get(key) is None else f"{f[key]:.1f}"

    names = ("shm", "tcp", "tcp_encrypted", "memcpy", "mooncake_tcp")
    rows = [("Gbit/s", *names)]
    rows.append((f"{f['blocks']} x {f['block_kib']} KiB", *(gbps(f"blocks_{n}_gbps") for n in names)))
    rows.append((f"1 x {f['buffer_mib']} MiB", *(gbps(f"buffer_{n}_gbps") for n in names)))
    rows.append(("both", *(gbps(f"{n}_gbps") for n in names)))
    width = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"dsi bench kv-transfer: two processes, median of {f['repeats']} repeats"]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, width, strict=True)) for r in rows]
    lines.append(f"shm/memcpy {f['shm_ratio']:.2f} (target >= 0.5)   tcp/memcpy {f['tcp_ratio']:.2f}")
    lines.append(f"tcp encrypted/clear {f['encrypted_ratio']:.2f} (target >= 0.7)")
    if f["mooncake_tcp_gbps"] is None:
        lines.append(f"mooncake: {f['mooncake_reason']}")
    else:
        mooncake = f["mooncake_tcp_gbps"]
        lines.append(
            f"tcp/mooncake tcp {f['tcp_gbps'] / mooncake:.2f} (target >= 1)"
            f"   tcp encrypted/mooncake tcp {f['tcp_encrypted_gbps'] / mooncake:.2f}"
        )
    return "\n".join(lines)


def _main(args: argparse.Namespace) -> int:
    figures = run(args.blocks, args.block_kib, args.buffer_mib, args.repeats, args.mooncake)
    print(json.dumps(figures) if args.json else format_table(figures))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "kv-transfer",
        help="KV data plane shm/tcp/encrypted tcp vs memcpy and Mooncake TCP, two processes",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--blocks", type=int, default=1000, help="KV blocks in the blocks case")
    parser.add_argument("--block-kib", type=int, default=112, help="size of one block (KiB)")
    parser.add_argument("--buffer-mib", type=int, default=64, help="size of the one-buffer case (MiB)")
    parser.add_argument("--repeats", type=int, default=5, help="repeats; figures are medians")
    parser.add_argument(
        "--no-mooncake", dest="mooncake", action="store_false", help="skip the Mooncake baseline"
    )
    parser.set_defaults(func=_main)
