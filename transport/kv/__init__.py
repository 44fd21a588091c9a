"""The KV data plane: bulk transfer of KV blocks and request state between prefill and decode.

Receiver-registered memory: ``plane.expect(id, nbytes, timeout_s)`` on the receiver, its
``inbound.target`` handed to the sender over the control plane, ``await plane.send(target, parts,
timeout_s)`` on the sender, ``await inbound.wait()`` then ``inbound.release()`` on the receiver.
An id is a receiver's lease: ``transfer_id(name, ...)`` makes one with 128 random bits.
Backends: tcp (ZeroMQ), shm (same host, /dev/shm), rdma (RC queue pairs, one-sided writes).
With the node's CURVE keys (``make_data_plane(..., keys=)``) every link proves both ends' keys and
seals every message with AES-256-GCM (dsi.transport.kv.link); without them links are clear.
"""

from dsi.errors import TransferFailed, TransferTimeout
from dsi.transport.kv.factory import make_data_plane
from dsi.transport.kv.ids import transfer_id
from dsi.transport.kv.inbound import Inbound, PlaneStats
from dsi.transport.kv.plane import DataPlane
from dsi.transport.kv.target import KvTarget

__all__ = [
    "DataPlane",
    "Inbound",
    "KvTarget",
    "PlaneStats",
    "TransferFailed",
    "TransferTimeout",
    "make_data_plane",
    "transfer_id",
]
