"""In-flight slots of the API keys: counted per HTTP worker, limited over all of them.

One worker counts in its own memory (``LocalSlots``). Several workers of one role share a table
in host shared memory (``SharedSlots``), created by the role's process (worker 0)::

    /dev/shm/dsi-slots-<role pid>-<hex>       int64 [workers, keys]: requests in flight
                                              per (worker, key)
    take(key, limit)  flock -> the key's column summed < limit ? own cell += 1 -> unlock
    give(key)         flock -> own cell -= 1 -> unlock
    clear(worker)     flock -> the worker's row = 0 -> unlock   (the role's process, once that
                                                               worker has exited)

The lock is an ``flock`` on the file, which the kernel releases when its holder dies, so a
killed worker never blocks the others; its row is cleared before its replacement starts, so
the slots it held do not leak. The file is named as ``HostBuffer.create`` names its files, so a
role killed outright leaves nothing behind once ``remove_files_of`` ran for it.
"""

from __future__ import annotations

import fcntl
import os
from typing import Protocol

import numpy as np

from dsi.kvcache.shm import HostBuffer


class KeySlots(Protocol):
    """Requests in flight per key (a key is its index in the keys file)."""

    def take(self, key: int, limit: int) -> bool:
        """Count one more request of ``key`` unless ``limit`` are in flight; whether it was."""
        ...

    def give(self, key: int) -> None:
        """One request of ``key`` ended."""
        ...

    def held(self, key: int) -> int:
        """Requests of ``key`` in flight (over every worker)."""
        ...


class LocalSlots:
    """The slots of a gateway that is the only worker of its role."""

    def __init__(self, keys: int) -> None:
        self._counts = [0] * keys

    def take(self, key: int, limit: int) -> bool:
        if self._counts[key] >= limit:
            return False
        self._counts[key] += 1
        return True

    def give(self, key: int) -> None:
        self._counts[key] -= 1

    def held(self, key: int) -> int:
        return self._counts[key]


class SharedSlots:
    """One worker's door to the shared table: ``create`` (the role's process, which owns and
    removes the file) or ``attach`` (the other workers, by the file's name)."""

    def __init__(self, buffer: HostBuffer, worker: int, workers: int, keys: int) -> None:
        if buffer.nbytes < workers * keys * 8 or not 0 <= worker < workers:
            raise ValueError(f"{buffer.name}: no row {worker} of a [{workers}, {keys}] slot table")
        self.name = buffer.name
        self.worker = worker
        self._buffer = buffer
        self._counts = buffer.numpy("int64")[: workers * keys].reshape(workers, keys)
        self._lock_fd = os.open(buffer.path, os.O_RDWR)

    @classmethod
    def create(cls, workers: int, keys: int) -> SharedSlots:
        """A zeroed table for ``workers`` x ``keys``, seen as worker 0."""
        return cls(HostBuffer.create(max(1, workers * keys) * 8, prefix="dsi-slots"), 0, workers, keys)

    @classmethod
    def attach(cls, name: str, worker: int, workers: int, keys: int) -> SharedSlots:
        return cls(HostBuffer(name), worker, workers, keys)

    def take(self, key: int, limit: int) -> bool:
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            if int(self._counts[:, key].sum()) >= limit:
                return False
            self._counts[self.worker, key] += 1
            return True
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def give(self, key: int) -> None:
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            self._counts[self.worker, key] -= 1
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def held(self, key: int) -> int:
        return int(self._counts[:, key].sum())

    def total(self) -> int:
        """Requests in flight, of every key and worker."""
        return int(self._counts.sum())

    def clear(self, worker: int) -> None:
        """Free every slot ``worker`` held (it has exited: nothing of it will be given back)."""
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            self._counts[worker, :] = 0
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Unmap (the creator also removes the file)."""
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
        self._counts = np.zeros((0, 0), dtype=np.int64)  # drop the view before the unmap
        self._buffer.close()
