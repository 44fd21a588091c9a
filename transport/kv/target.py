"""KvTarget: where a sender writes one transfer, as the receiver described it."""

from __future__ import annotations

import msgspec

BACKENDS = ("tcp", "shm", "rdma")


class KvTarget(msgspec.Struct, array_like=True, frozen=True):
    """A receive region lent to one sender for one transfer; travels inside control messages (msgpack).

    ``address`` is the receiver's data-plane endpoint (``tcp://127.0.0.1:41234``), ``nbytes`` the exact
    size the sender must write, ``region`` a backend-specific descriptor (shm file + offset, rdma
    address + rkey + slot), opaque to callers.
    """

    backend: str
    address: str
    transfer_id: str
    nbytes: int
    region: bytes = b""
