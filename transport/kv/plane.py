"""DataPlane: the interface every KV data-plane backend implements (tcp, shm, rdma).

Receiver-registered memory, as in RDMA: the receiver ``expect``s a transfer (allocating its
receive region) and hands the ``KvTarget`` to the sender inside a control message; the sender
``send``s its buffers into that target; the receiver's ``Inbound`` completes once every byte is in.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dsi.errors import TransferFailed, TransferTimeout
from dsi.transport.kv.inbound import Inbound, PlaneStats, ReceiveTable
from dsi.transport.kv.parts import Buffer
from dsi.transport.kv.regions import Region
from dsi.transport.kv.target import KvTarget

if TYPE_CHECKING:
    from dsi.transport.kv.sessions import SessionCounts


class DataPlane(abc.ABC):
    """One process's end of the KV data plane: receives into its own regions, sends into others'."""

    backend: str = ""

    def __init__(self, table: ReceiveTable) -> None:
        self.address = ""  # valid after start()
        self.keyed = False  # whether its links prove keys and seal every message (tcp, shm, rdma)
        self._table = table
        self._counters = table.stats

    @abc.abstractmethod
    async def start(self) -> None:
        """Bind the receive endpoint; sets ``address``."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Fail every pending transfer (both directions) and free every region."""

    @abc.abstractmethod
    async def send(self, target: KvTarget, parts: Sequence[Buffer], timeout_s: float) -> None:
        """Write the concatenation of ``parts`` into ``target``; returns once the receiver has it all.

        ``parts``: bytes-like objects, memoryviews, numpy arrays or contiguous CPU torch tensors;
        their sizes must add up to ``target.nbytes`` (ValueError otherwise). Raises TransferFailed
        (refused, unknown id, receiver gone) or TransferTimeout after ``timeout_s`` seconds.
        Cancelling the awaiting task stops the transfer and tells the receiver.
        """

    def region_descriptor(self, region: Region) -> bytes:
        """The backend's ``KvTarget.region`` for a receive region (empty where none is needed)."""
        return b""

    def expect(self, transfer_id: str, nbytes: int, timeout_s: float) -> Inbound:
        """Allocate a receive region of ``nbytes`` for ``transfer_id``; the Inbound fails with
        TransferTimeout (and frees the region) unless the transfer completes within ``timeout_s``."""
        if not self.address:
            raise RuntimeError(f"{self.backend} data plane: expect() before start()")

        def make_target(region: Region) -> KvTarget:
            return KvTarget(self.backend, self.address, transfer_id, nbytes, self.region_descriptor(region))

        return self._table.expect(make_target, transfer_id, nbytes, timeout_s)

    def cancel(self, transfer_id: str) -> None:
        """Fail an expected transfer with Cancelled and free its region (no-op if it is not open)."""
        self._table.cancel(transfer_id)

    @property
    def sessions(self) -> SessionCounts | None:
        """Handshake counters of a keyed receiving end (None: clear, not started, or a backend
        that keeps none)."""
        return None

    @property
    def stats(self) -> PlaneStats:
        """A snapshot of the counters."""
        pool = self._table.pool
        return dataclasses.replace(self._counters, regions_live=pool.live, bytes_live=pool.live_bytes)

    def _sent(self, target: KvTarget) -> None:
        self._counters.transfers_out += 1
        self._counters.bytes_out += target.nbytes

    def _send_failed(self, error: BaseException, target: KvTarget, timeout_s: float, waited_for: str) -> None:
        """Count a failed send; a timeout is raised as TransferTimeout, anything else the caller re-raises."""
        self._counters.failed += 1
        if isinstance(error, TimeoutError):
            self._counters.timed_out += 1
            raise TransferTimeout(
                f"transfer {target.transfer_id!r} to {target.address}: {waited_for} in {timeout_s}s"
            ) from None

    def _sender_lost(self, sender: bytes) -> None:
        """A keyed link closed on a failed record: the transfers its sender was writing fail."""
        self._table.holder_lost(sender, TransferFailed("the sender's link closed: a record failed to open"))

    def _check_target(self, target: KvTarget) -> None:
        if target.backend != self.backend:
            raise ValueError(f"a {target.backend} target cannot be sent over the {self.backend} data plane")
