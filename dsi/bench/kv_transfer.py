"""``dsi bench kv-transfer``: the KV data plane between two processes, beside a plain memcpy.

Two cases, each a full transfer timed at the sender from ``send`` to the receiver's confirmation::

    blocks   1,000 KV blocks of 112 KiB, passed as 1,000 parts (one prefill's KV for one request)
    buffer   one 64 MiB buffer

Backends: ``shm``, ``tcp`` and ``tcp_encrypted`` (dsi, receiver in a child process; the last is
the same tcp plane with CURVE keys, a key set made for the run: one handshake per connection, then
AES-256-GCM on every chunk), ``memcpy`` (numpy copyto of the same parts into a warm buffer in this
process: the bound shm can approach), and Mooncake's TCP transport (``mooncake_tcp``: a sender
and a receiver process of their own, from Mooncake's own venv, made on first use; see
dsi.bench.kv_mooncake), its bytes checked at the receiver once per case, its time taken by the
sender around the write call. Within a repeat the backends take turns, so all see the same
load on a shared machine; each figure is the median over repeats, in Gbit/s (1e9
bits per second). Headline figures count both cases together: their bytes over the sum of their
median times. ``shm_ratio``/``tcp_ratio`` are against ``memcpy``; ``encrypted_ratio`` is
``tcp_encrypted`` against ``tcp``; ``tcp_vs_mooncake``/``tcp_encrypted_vs_mooncake`` against
``mooncake_tcp``, or ``mooncake_reason`` says exactly why Mooncake was not measured.
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
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import uvloop

from dsi.bench.kv_mooncake import DEFAULT_VENV, PACKAGE, MooncakeTcp, MooncakeUnavailable, open_mooncake
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


async def _measure(
    cases: dict[str, list[np.ndarray]], repeats: int, mooncake: MooncakeTcp | None, key_files: dict[str, Path]
) -> tuple[dict[str, dict[str, list[float]]], str | None]:
    """Seconds per case and figure name, and why Mooncake stopped being measured (None: it was not)."""
    failed: str | None = None
    receiver = _Receiver(key_files)
    planes = _planes(_keys(key_files))
    for plane in planes.values():
        await plane.start()
    destination = np.ones(max(sum(p.nbytes for p in parts) for parts in cases.values()), np.uint8)
    seconds: dict[str, dict[str, list[float]]] = {case: {} for case in cases}
    try:
        for repeat in range(repeats + 1):  # the first round warms pools, mappings and connections
            for index, (case, parts) in enumerate(cases.items()):
                times = {
                    name: await _time_dsi(name, plane, receiver, parts) for name, plane in planes.items()
                }
                times["memcpy"] = _time_memcpy(parts, destination)
                if mooncake is not None and failed is None:
                    try:
                        times["mooncake_tcp"] = mooncake.write(index, verify=not repeat)
                    except MooncakeUnavailable as error:
                        failed = f"mooncake failed while measured: {error}"
                if repeat:
                    for name, s in times.items():
                        seconds[case].setdefault(name, []).append(s)
    finally:
        for plane in planes.values():
            await plane.close()
        receiver.stop()
    if failed is not None:
        for times in seconds.values():
            times.pop("mooncake_tcp", None)
    return seconds, failed


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
    if "mooncake_tcp_gbps" in figures:
        figures["tcp_vs_mooncake"] = figures["tcp_gbps"] / figures["mooncake_tcp_gbps"]
        figures["tcp_encrypted_vs_mooncake"] = figures["tcp_encrypted_gbps"] / figures["mooncake_tcp_gbps"]
    return figures


def run(
    blocks: int = 1000,
    block_kib: int = 112,
    buffer_mib: int = 64,
    repeats: int = 5,
    mooncake: bool = True,
    mooncake_venv: Path = DEFAULT_VENV,
    mooncake_package: str = PACKAGE,
) -> dict[str, Any]:
    """Measure every backend on both cases; every child process is stopped before this returns.
    ``mooncake_venv``: Mooncake's own venv, made with ``mooncake_package`` unless it has it."""
    if blocks < 1 or block_kib < 1 or buffer_mib < 1 or repeats < 1:
        raise ValueError("blocks, block_kib, buffer_mib and repeats must be positive")
    cases = _cases(blocks, block_kib << 10, buffer_mib << 20)
    baseline: MooncakeTcp | None = None
    reason: str | None = "disabled with --no-mooncake"
    if mooncake:
        shapes = [(len(parts), parts[0].nbytes) for parts in cases.values()]
        baseline, reason = open_mooncake(mooncake_venv, mooncake_package, shapes)
    try:
        with tempfile.TemporaryDirectory(prefix="dsi-bench-keys-") as folder:
            key_files = generate_keys(Path(folder) / "keys")
            seconds, failed = uvloop.run(_measure(cases, repeats, baseline, key_files))
    finally:
        if baseline is not None:
            baseline.close()
    figures = _figures(cases, seconds)
    figures.setdefault("mooncake_tcp_gbps", None)
    figures["mooncake_reason"] = failed or reason
    figures["mooncake"] = {
        "package": mooncake_package if mooncake else None,
        "version": baseline.version if baseline is not None else None,
        "venv": str(mooncake_venv) if mooncake else None,
        "verified": baseline is not None and failed is None,  # the receiver held the sent bytes
    }
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
        lines.append(
            f"tcp/mooncake tcp {f['tcp_vs_mooncake']:.2f} (target >= 1)"
            f"   tcp encrypted/mooncake tcp {f['tcp_encrypted_vs_mooncake']:.2f}"
            f"   ({f['mooncake']['version']}, bytes checked at the receiver)"
        )
    return "\n".join(lines)


def _main(args: argparse.Namespace) -> int:
    figures = run(
        args.blocks,
        args.block_kib,
        args.buffer_mib,
        args.repeats,
        args.mooncake,
        Path(args.mooncake_venv),
        args.mooncake_package,
    )
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
    parser.add_argument(
        "--mooncake-venv",
        default=str(DEFAULT_VENV),
        help="Mooncake's own venv, made (pip install) on first use (default: run/peers/mooncake)",
    )
    parser.add_argument(
        "--mooncake-package",
        default=PACKAGE,
        help=f"what pip installs into that venv (default {PACKAGE}; the CUDA build is"
        " mooncake-transfer-engine)",
    )
    parser.set_defaults(func=_main)
