"""The rdma data plane's protocol logic, pure: region descriptors, immediate data, chunk plans,
slot numbers and the sender's work-request bookkeeping. No I/O here.

A transfer is written as RDMA WRITE WITH IMMEDIATE work requests, one per chunk of the receive
region, each at most ``chunk_bytes`` (the receiver picks it, under the device's max message size)::

    remote region  [ chunk 0 | chunk 1 | ... | chunk n-1 (short) ]        offset = index * chunk_bytes
    immediate      slot (12 bits) << 20 | chunk index (20 bits)

The receiver counts the recv completions of a slot; when their bytes add up to ``nbytes`` the
transfer is complete.
"""

from __future__ import annotations

import math
from collections import deque

import msgspec

from dsi.errors import TransferFailed, register_error

SLOT_BITS, CHUNK_BITS = 12, 20
SLOTS = 1 << SLOT_BITS  # transfers a receiver can have open at once
MAX_CHUNKS = 1 << CHUNK_BITS


class RdmaRegion(msgspec.Struct, array_like=True, frozen=True):
    """``KvTarget.region`` of the rdma backend."""

    addr: int  # remote virtual address of byte 0
    rkey: int
    slot: int
    chunk_bytes: int


def encode_imm(slot: int, chunk: int) -> int:
    if not (0 <= slot < SLOTS and 0 <= chunk < MAX_CHUNKS):
        raise ValueError(f"slot {slot} / chunk {chunk} out of range")
    return slot << CHUNK_BITS | chunk


def decode_imm(imm: int) -> tuple[int, int]:
    """(slot, chunk index) of an immediate."""
    return imm >> CHUNK_BITS, imm & (MAX_CHUNKS - 1)


def chunk_size(nbytes: int, preferred: int, max_msg_bytes: int) -> int:
    """Bytes per chunk: ``preferred`` under the device limit, larger if the chunk count would overflow."""
    size = min(preferred, max_msg_bytes)
    size = max(size, math.ceil(nbytes / MAX_CHUNKS))
    if size > max_msg_bytes:
        raise ValueError(f"{nbytes} bytes need chunks over the device's {max_msg_bytes}-byte messages")
    return size


def chunk_plan(nbytes: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """``[(offset, length)]`` of every chunk, in bytes. Example: ``chunk_plan(10, 4)`` ->
    ``[(0, 4), (4, 4), (8, 2)]``."""
    return [(at, min(chunk_bytes, nbytes - at)) for at in range(0, nbytes, chunk_bytes)]


def chunk_length(nbytes: int, chunk_bytes: int, index: int) -> int:
    """Bytes of chunk ``index`` (0 when the index is past the end)."""
    return max(0, min(chunk_bytes, nbytes - index * chunk_bytes))


class SlotTable:
    """Slot numbers of open transfers; handed out round robin so a slot rests before it is reused."""

    def __init__(self) -> None:
        self._owner: dict[int, str] = {}
        self._next = 0

    def take(self, transfer_id: str, busy: callable) -> int:  # type: ignore[valid-type]
        """A slot whose previous transfer no longer takes writes (``busy(transfer_id)`` is false)."""
        for _ in range(SLOTS):
            slot, self._next = self._next, (self._next + 1) % SLOTS
            owner = self._owner.get(slot)
            if owner is None or not busy(owner):
                self._owner[slot] = transfer_id
                return slot
        raise RuntimeError(f"all {SLOTS} rdma transfer slots are in use")

    def owner(self, slot: int) -> str | None:
        return self._owner.get(slot)


class WriteBatch:
    """The sender's view of one transfer's work requests: what is posted, what has completed.

    ``post`` is given the chunks still to post while fewer than ``window`` are outstanding;
    completions come back through ``completed``. ``error`` is the first failed completion.
    """

    def __init__(self, plan: list[tuple[int, int]], window: int, number: int = 0) -> None:
        self.plan = plan
        self.window = window
        self.number = number  # high bits of its work request ids: ``number << CHUNK_BITS | index``
        self.next = 0  # index of the next chunk to post
        self.outstanding = 0
        self.done = 0
        self.error = ""

    def to_post(self, limit: int | None = None) -> list[int]:
        """Chunk indexes to post now: at most ``window`` outstanding, and at most ``limit`` (the
        room left in the queue pair's send queue, which other transfers share)."""
        if self.error:
            return []
        room = self.window - self.outstanding if limit is None else min(self.window - self.outstanding, limit)
        indexes = list(range(self.next, min(len(self.plan), self.next + room)))
        self.next += len(indexes)
        self.outstanding += len(indexes)
        return indexes

    def completed(self, ok: bool, error: str = "") -> None:
        self.outstanding -= 1
        self.done += ok
        if not ok and not self.error:
            self.error = error or "work request failed"

    @property
    def finished(self) -> bool:
        """Every chunk written (or a failure, with nothing left outstanding)."""
        return self.done == len(self.plan) or (bool(self.error) and self.outstanding == 0)

    @property
    def posted_all(self) -> bool:
        """Nothing more to post (every chunk posted, or a failure stopped posting)."""
        return bool(self.error) or self.next == len(self.plan)


@register_error
class NotConnected(TransferFailed):
    """The receiver has no queue pair for this sender (it restarted, or never saw a Connect)."""

    code = "rdma_not_connected"


class SendQueue:
    """One queue pair's send queue, shared by every transfer to that receiver.

    A queue pair takes at most ``depth`` outstanding work requests (posted, completion not yet
    polled); posting more fails on a real device. Transfers wait their turn here, first come first
    served, and each turn posts what the queue has room for::

        waiting  [batch a][batch b] ...   take(): (batch, chunk indexes) while room remains
        room     depth - outstanding      completed(): one slot back

    ``broken``: a work request failed, so the queue pair is in the error state for good (RC); no
    new transfer may use it, and it is destroyed once nothing is outstanding.
    """

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.outstanding = 0
        self.waiting: deque[WriteBatch] = deque()
        self.broken = False

    def take(self) -> list[tuple[WriteBatch, list[int]]]:
        """The posts to make now, in order; counts them as outstanding."""
        out = []
        for batch in list(self.waiting):  # a batch whose own window is full lets the next one post
            if self.outstanding >= self.depth:
                break
            indexes = batch.to_post(self.depth - self.outstanding)
            self.outstanding += len(indexes)
            if indexes:
                out.append((batch, indexes))
            if batch.posted_all:
                self.waiting.remove(batch)
        return out

    def completed(self) -> None:
        self.outstanding -= 1
