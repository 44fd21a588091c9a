"""A stand-in for ``mooncake.engine`` in tests: the TransferEngine calls that
dsi.bench.kv_mooncake_runner makes, with writes carried over a local TCP socket.

``initialize`` listens on the host; a write connects to the session's port and sends
``[dst: u64][n: u64][n bytes]`` per part; the receiving engine copies each part to ``dst`` in its
own memory and answers one byte when the sender is done. With ``FAKE_MOONCAKE_CORRUPT=1`` in the
receiver's environment it flips the first byte of every part (the runner must notice).
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import threading

_PART = struct.Struct(">QQ")


class TransferEngine:
    def initialize(self, host: str, metadata: str, protocol: str, device: str) -> int:
        if (metadata, protocol) != ("P2PHANDSHAKE", "tcp"):
            return -1
        self._server = socket.create_server((host, 0))
        threading.Thread(target=self._serve, daemon=True).start()
        return 0

    def get_rpc_port(self) -> int:
        return self._server.getsockname()[1]

    def register_memory(self, address: int, nbytes: int) -> int:
        return 0

    def unregister_memory(self, address: int) -> int:
        return 0

    def transfer_sync_write(self, session: str, source: int, target: int, nbytes: int) -> int:
        return self.batch_transfer_sync_write(session, [source], [target], [nbytes])

    def batch_transfer_sync_write(
        self, session: str, sources: list[int], targets: list[int], sizes: list[int]
    ) -> int:
        host, port = session.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as conn:
            for source, target, nbytes in zip(sources, targets, sizes, strict=True):
                conn.sendall(_PART.pack(target, nbytes) + ctypes.string_at(source, nbytes))
            conn.shutdown(socket.SHUT_WR)
            return 0 if conn.recv(1) == b"k" else -1

    def _serve(self) -> None:
        corrupt = os.environ.get("FAKE_MOONCAKE_CORRUPT") == "1"
        while True:
            conn, _ = self._server.accept()
            with conn, conn.makefile("rb") as stream:
                while head := stream.read(_PART.size):
                    target, nbytes = _PART.unpack(head)
                    data = bytearray(stream.read(nbytes))
                    if corrupt:
                        data[0] ^= 0xFF
                    ctypes.memmove(target, bytes(data), nbytes)
                conn.sendall(b"k")
