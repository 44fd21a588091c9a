"""Mooncake's TCP transport as the baseline of ``dsi bench kv-transfer`` (when it is installed).

Same shape as the dsi figures: a receiver process registers one buffer and reports its session
(``127.0.0.1:<rpc port>``, handshake "P2PHANDSHAKE", protocol "tcp") and address; the sender
writes with ``transfer_sync_write`` (one buffer) or ``batch_transfer_sync_write`` (the blocks, one
entry each), which return once the bytes are written at the receiver.
"""

from __future__ import annotations

import contextlib
import multiprocessing
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

_WAIT_S = 60.0


def unavailable() -> str | None:
    """Why Mooncake cannot be measured here, or None when it can."""
    try:
        from mooncake.engine import TransferEngine  # noqa: F401
    except Exception as error:  # ImportError, or its native library missing (OSError)
        return f"mooncake transfer engine not importable: {type(error).__name__}: {error}"
    return None


def _engine() -> Any:
    from mooncake.engine import TransferEngine

    engine = TransferEngine()
    if engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
        raise RuntimeError("mooncake TransferEngine.initialize failed")
    return engine


def _receiver_main(conn: Connection, nbytes: int) -> None:
    engine = _engine()
    buffer = np.zeros(nbytes, np.uint8)
    if engine.register_memory(buffer.ctypes.data, nbytes) != 0:
        raise RuntimeError("mooncake register_memory failed")
    conn.send((f"127.0.0.1:{engine.get_rpc_port()}", buffer.ctypes.data))
    conn.recv()  # serves until the sender says stop


class MooncakeTcp:
    """A sender engine and its receiver process with ``nbytes`` registered."""

    def __init__(self, nbytes: int) -> None:
        mp = multiprocessing.get_context("spawn")
        self._conn, there = mp.Pipe()
        self._process = mp.Process(target=_receiver_main, args=(there, nbytes), daemon=True)
        self._process.start()
        there.close()
        if not self._conn.poll(_WAIT_S):
            self.close()
            raise RuntimeError("mooncake receiver did not start")
        self._session, self._remote = self._conn.recv()
        self._engine = _engine()
        self._registered: list[np.ndarray] = []

    def register(self, source: np.ndarray) -> None:
        if self._engine.register_memory(source.ctypes.data, source.nbytes) != 0:
            raise RuntimeError("mooncake register_memory failed")
        self._registered.append(source)

    def write(self, parts: list[np.ndarray]) -> None:
        """Write ``parts`` back to back at the start of the receiver's buffer (sources registered)."""
        offsets = np.cumsum([0] + [p.nbytes for p in parts[:-1]])
        if len(parts) == 1:
            rc = self._engine.transfer_sync_write(
                self._session, parts[0].ctypes.data, self._remote, parts[0].nbytes
            )
        else:
            rc = self._engine.batch_transfer_sync_write(
                self._session,
                [p.ctypes.data for p in parts],
                [self._remote + int(o) for o in offsets],
                [p.nbytes for p in parts],
            )
        if rc != 0:
            raise RuntimeError(f"mooncake write failed: {rc}")

    def close(self) -> None:
        for source in self._registered:
            self._engine.unregister_memory(source.ctypes.data)
        self._registered.clear()
        with contextlib.suppress(OSError):
            self._conn.send("stop")
        self._process.join(5.0)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
