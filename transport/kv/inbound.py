"""Receive side bookkeeping: one Inbound per expected transfer, and the table that owns them.

Lifecycle of an Inbound (its region is allocated at ``expect``)::

    expect ──► PENDING ──begin──► WRITING ──all bytes──► DONE ──release()──► region freed
                  │                   │
                  │ timeout, cancel,  │ same, while a sender may still be writing into the region:
                  │ close, abort      │ the waiter fails at once, the region is freed when the sender
                  ▼                   ▼ says it stopped (done/abort) or after ``grace_s``
               FAILED (region freed)  FAILED (region quarantined)

``begin`` is how one-sided writers (shm, rdma) claim the region before writing into it, so a region
is never reused while a slow sender may still be writing. tcp copies on the receiver and needs no
quarantine, but goes through the same states.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Callable
from dataclasses import dataclass

from dsi.errors import Cancelled, DsiError, TransferFailed, TransferTimeout
from dsi.transport.kv.regions import Region, RegionPool
from dsi.transport.kv.target import KvTarget


@dataclass(slots=True)
class PlaneStats:
    """Counters of one data plane; ``regions_live``/``bytes_live`` are receive regions not yet freed."""

    transfers_in: int = 0
    transfers_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    failed: int = 0
    timed_out: int = 0
    regions_live: int = 0
    bytes_live: int = 0


class State(enum.Enum):
    PENDING = "pending"
    WRITING = "writing"
    DONE = "done"
    FAILED = "failed"


class Inbound:
    """One expected transfer: ``wait()`` for its bytes, copy them out, then ``release()``."""

    def __init__(self, target: KvTarget, region: Region, view: memoryview, table: ReceiveTable) -> None:
        self.target = target
        self.region = region
        self.view = view  # the receive region, [nbytes] uint8
        self.state = State.PENDING
        self.received = 0  # bytes so far
        self.holder: object = None  # the sender that began writing (backend-specific identity)
        self.timer: asyncio.TimerHandle | None = None
        self._table = table
        self._freed = False
        self._future: asyncio.Future[memoryview] = asyncio.get_running_loop().create_future()
        self._future.add_done_callback(_mark_retrieved)

    async def wait(self) -> memoryview:
        """The received bytes ([nbytes] uint8, valid until ``release``); raises TransferFailed,
        TransferTimeout or Cancelled. Cancelling the waiting task does not cancel the transfer."""
        return await asyncio.shield(self._future)

    def release(self) -> None:
        """Free the region (idempotent); before completion this cancels the transfer."""
        if self.state in (State.PENDING, State.WRITING):
            self._table.fail(
                self, Cancelled(f"transfer {self.target.transfer_id} released before completion")
            )
        else:
            self.free_region()

    # ---- used by the table ----------------------------------------------------------------------
    def settle(self, error: DsiError | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if error is None:
            self.state = State.DONE
            self._future.set_result(self.view)
        else:
            self.state = State.FAILED
            self._future.set_exception(error)

    def free_region(self) -> None:
        if not self._freed:
            self._freed = True
            with contextlib.suppress(BufferError):  # unless the caller holds an array over it,
                self.view.release()  # reading after release fails loudly instead of seeing reused bytes
            self._table.freed(self)


def _mark_retrieved(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()  # nobody may wait on a transfer that failed: no "never retrieved" noise


class ReceiveTable:
    """Every expected transfer of one data plane, keyed by transfer id while it can still receive."""

    def __init__(self, pool: RegionPool, stats: PlaneStats, grace_s: float = 5.0) -> None:
        self.pool = pool
        self.stats = stats
        self.grace_s = grace_s  # seconds a failed region stays quarantined while its sender may write
        self._open: dict[str, Inbound] = {}
        self._live: set[Inbound] = set()  # not yet freed
        self._quarantined: dict[str, Inbound] = {}  # failed while a sender may still write

    def expect(
        self, make_target: Callable[[Region], KvTarget], transfer_id: str, nbytes: int, timeout_s: float
    ) -> Inbound:
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, not {nbytes}")
        if transfer_id in self._open:
            raise ValueError(f"transfer {transfer_id!r} is already expected")
        region = self.pool.alloc(nbytes)
        inbound = Inbound(make_target(region), region, self.pool.view(region), self)
        self._open[transfer_id] = inbound
        self._live.add(inbound)
        inbound.timer = asyncio.get_running_loop().call_later(timeout_s, self._expire, inbound)
        return inbound

    def get(self, transfer_id: str) -> Inbound | None:
        """The transfer if it can still receive bytes."""
        return self._open.get(transfer_id)

    def writable(self, transfer_id: str) -> bool:
        """Whether a sender may still write into the transfer's region (open or quarantined)."""
        return transfer_id in self._open or transfer_id in self._quarantined

    def begin(self, transfer_id: str, nbytes: int, holder: object) -> Inbound:
        """A sender claims the region before writing into it; TransferFailed if it may not."""
        inbound = self._open.get(transfer_id)
        if inbound is None:
            raise TransferFailed(f"unknown or expired transfer id {transfer_id!r}")
        if inbound.target.nbytes != nbytes:
            error = TransferFailed(
                f"transfer {transfer_id!r}: {nbytes} bytes sent, {inbound.target.nbytes} expected"
            )
            self.fail(inbound, error)
            raise error
        if inbound.state is State.WRITING and inbound.holder != holder:
            raise TransferFailed(f"transfer {transfer_id!r} is being written by another sender")
        inbound.state, inbound.holder = State.WRITING, holder
        return inbound

    def received(self, inbound: Inbound, nbytes: int) -> bool:
        """Count ``nbytes`` more; completes the transfer (True) once every byte is in."""
        inbound.received += nbytes
        if inbound.received < inbound.target.nbytes:
            return False
        self.complete(inbound)
        return True

    def complete(self, inbound: Inbound) -> None:
        self._open.pop(inbound.target.transfer_id, None)
        self.stats.transfers_in += 1
        self.stats.bytes_in += inbound.target.nbytes
        inbound.settle(None)

    def fail(self, inbound: Inbound, error: DsiError) -> None:
        """Fail a transfer that can still receive; its region is freed, or quarantined while written."""
        if inbound.state not in (State.PENDING, State.WRITING):
            return
        self._open.pop(inbound.target.transfer_id, None)
        self.stats.failed += 1
        self.stats.timed_out += isinstance(error, TransferTimeout)
        writing = inbound.state is State.WRITING
        inbound.settle(error)
        if writing:
            self._quarantined[inbound.target.transfer_id] = inbound
            asyncio.get_running_loop().call_later(self.grace_s, self._unquarantine, inbound)
        else:
            inbound.free_region()

    def stopped(self, transfer_id: str) -> None:
        """The sender of a failed transfer says it no longer writes: a quarantined region is freed."""
        inbound = self._quarantined.get(transfer_id)
        if inbound is not None:
            self._unquarantine(inbound)

    def sender_aborted(self, transfer_id: str, sender: bytes) -> None:
        """The sender gave up (and no longer writes): fail the transfer if it is that sender's."""
        inbound = self.get(transfer_id)
        if inbound is not None and inbound.holder in (None, sender):
            self.fail(inbound, TransferFailed(f"transfer {transfer_id!r}: the sender aborted"))
        self.stopped(transfer_id)

    def holder_lost(self, holder: object, error: DsiError) -> None:
        """Fail every transfer ``holder`` began writing (its link was closed)."""
        for inbound in [i for i in self._open.values() if i.state is State.WRITING and i.holder == holder]:
            self.fail(inbound, error)

    def _unquarantine(self, inbound: Inbound) -> None:
        if self._quarantined.get(inbound.target.transfer_id) is inbound:
            del self._quarantined[inbound.target.transfer_id]
        inbound.free_region()

    def cancel(self, transfer_id: str) -> None:
        inbound = self._open.get(transfer_id)
        if inbound is not None:
            self.fail(inbound, Cancelled(f"transfer {transfer_id!r} cancelled by the receiver"))

    def freed(self, inbound: Inbound) -> None:
        self._live.discard(inbound)
        self.pool.free(inbound.region)

    def close(self) -> None:
        """Fail every open transfer and free every region (the pool's slabs go too)."""
        for inbound in list(self._open.values()):
            self.fail(inbound, TransferFailed(f"transfer {inbound.target.transfer_id!r}: receiver closed"))
        self._quarantined.clear()
        for inbound in list(self._live):
            inbound.free_region()
        self.pool.close()

    def _expire(self, inbound: Inbound) -> None:
        self.fail(inbound, TransferTimeout(f"transfer {inbound.target.transfer_id!r} not complete in time"))
