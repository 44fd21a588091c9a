"""Verbs: the few RDMA verbs the rdma data plane uses, so the protocol runs on a fake or on pyverbs.

Implementations: :mod:`.fake` (in-process loopback, for tests) and :mod:`.pyverbs_device` (a real
device through rdma-core's pyverbs). Memory is host memory registered as a region (``MemoryRegion``:
address, keys and a memoryview of its bytes). Queue pairs are reliable-connected (RC) and named by
their local number (``qpn``); the plane exchanges ``QpInfo`` over ZeroMQ and calls ``connect``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class QpInfo:
    """What the other side needs to connect to a queue pair."""

    qpn: int
    lid: int
    gid: bytes  # RoCE routes by GID; opaque to the protocol (pyverbs: its text form, ASCII)


@dataclass(slots=True)
class MemoryRegion:
    addr: int  # virtual address of the first byte
    length: int  # bytes
    lkey: int
    rkey: int
    view: memoryview  # [length] uint8
    handle: object = None  # the implementation's own object


@dataclass(frozen=True, slots=True)
class Completion:
    """One work completion. ``recv``: an RDMA WRITE with immediate landed (``imm`` carries its data)."""

    wr_id: int
    qpn: int  # the local queue pair it completed on
    recv: bool
    ok: bool
    imm: int = 0
    error: str = ""


class Verbs(Protocol):
    max_msg_bytes: int  # the largest single RDMA WRITE
    send_depth: int  # work requests a queue pair can have outstanding

    def register(self, nbytes: int) -> MemoryRegion:
        """Allocate and register ``nbytes`` of host memory for local and remote write."""

    def deregister(self, mr: MemoryRegion) -> None: ...

    def create_qp(self) -> QpInfo: ...

    def connect(self, qpn: int, remote: QpInfo) -> None:
        """Move the local queue pair to ready-to-send, connected to ``remote``."""

    def destroy_qp(self, qpn: int) -> None: ...

    def post_recv(self, qpn: int, wr_id: int) -> None:
        """One receive work request: consumed by one incoming WRITE with immediate."""

    def post_write_imm(
        self,
        qpn: int,
        wr_id: int,
        local: MemoryRegion,
        offset: int,
        length: int,
        remote_addr: int,
        rkey: int,
        imm: int,
    ) -> None:
        """RDMA WRITE ``local[offset:offset+length]`` to ``remote_addr`` with 32-bit immediate ``imm``."""

    def poll(self) -> list[Completion]:
        """Completions waiting now (never blocks)."""

    def fileno(self) -> int:
        """A descriptor that turns readable when completions may be waiting."""

    def arm(self) -> None:
        """Consume the wake-up and ask for the next one; call before polling until empty."""

    def close(self) -> None: ...
