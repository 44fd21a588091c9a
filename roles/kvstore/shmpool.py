"""ShmPool: reusable HostBuffers that a kvstore reads blocks into.

Creating a /dev/shm file and mapping it costs syscalls and page faults per call; a fetch of a
few blocks would pay that each time. The pool keeps released buffers and hands out the
smallest free one that fits; new buffers are sized up to a power of two (at least
``min_bytes``), so a few sizes cover every request. At most ``keep_free`` idle buffers stay
mapped; the others are unlinked when released.

A buffer whose read failed or was cancelled is ``discard``-ed, never reused: the kvstore's read
threads may still be writing into it after the caller stopped waiting.
"""

from __future__ import annotations

from dsi.kvcache.shm import HostBuffer


class ShmPool:
    def __init__(self, prefix: str = "dsi-kvc", min_bytes: int = 1 << 20, keep_free: int = 4) -> None:
        if min_bytes < 1 or keep_free < 0:
            raise ValueError(f"min_bytes must be >= 1 and keep_free >= 0, got {min_bytes}, {keep_free}")
        self.prefix = prefix
        self.min_bytes = min_bytes
        self.keep_free = keep_free
        self.created = 0
        self._free: list[HostBuffer] = []
        self._used: set[int] = set()  # id() of buffers handed out
        self._closed = False

    @property
    def in_use(self) -> int:
        return len(self._used)

    @property
    def idle(self) -> int:
        return len(self._free)

    def acquire(self, nbytes: int) -> HostBuffer:
        """A buffer of at least ``nbytes`` (bytes), owned by the caller until release/discard."""
        if self._closed:
            raise RuntimeError("the shm pool is closed")
        fits = [b for b in self._free if b.nbytes >= nbytes]
        if fits:
            buf = min(fits, key=lambda b: b.nbytes)
            self._free.remove(buf)
        else:
            buf = HostBuffer.create(max(self.min_bytes, 1 << max(0, nbytes - 1).bit_length()), self.prefix)
            self.created += 1
        self._used.add(id(buf))
        return buf

    def release(self, buf: HostBuffer) -> None:
        """Back to the pool: its bytes may be overwritten by the next fetch."""
        self._used.discard(id(buf))
        if self._closed or len(self._free) >= self.keep_free:
            buf.close()
        else:
            self._free.append(buf)

    def discard(self, buf: HostBuffer) -> None:
        """Unlink a buffer that must not be reused (a read may still land in it)."""
        self._used.discard(id(buf))
        buf.close()

    def close(self) -> None:
        """Unlink the idle buffers; those in use are unlinked when released."""
        self._closed = True
        for buf in self._free:
            buf.close()
        self._free.clear()
