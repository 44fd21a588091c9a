"""The messages of the data plane's ZeroMQ channel: one typed family, msgpack, tagged arrays.

Sender -> receiver (DEALER -> ROUTER)::

    Chunk  [header][payload frame]...   tcp: bytes [offset, offset + sum(frames)) of the transfer
    Begin  [header]                     shm/rdma: claim the region before writing into it
    Done   [header]                     shm/rdma: every byte is written
    Abort  [header]                     the sender gave up (cancelled, timed out)

Receiver -> sender: ``Ack`` (a chunk, a begin or the whole transfer when ``done``) or ``Refuse``.
rdma exchanges queue pairs first: ``Connect`` -> ``Connected``.
"""

from __future__ import annotations

import msgspec

from dsi.errors import ErrorInfo


class Chunk(msgspec.Struct, array_like=True, tag="c", gc=False):
    transfer_id: str
    offset: int  # bytes from the start of the transfer
    total: int  # bytes of the whole transfer
    seq: int  # chunk number, echoed in the Ack


class Begin(msgspec.Struct, array_like=True, tag="b", gc=False):
    transfer_id: str
    nbytes: int


class Done(msgspec.Struct, array_like=True, tag="d", gc=False):
    transfer_id: str
    nbytes: int


class Abort(msgspec.Struct, array_like=True, tag="a", gc=False):
    transfer_id: str


class Connect(msgspec.Struct, array_like=True, tag="q", gc=False):
    """rdma: the sender's queue pair, sent with its first transfer to a receiver."""

    transfer_id: str
    qpn: int
    lid: int
    gid: bytes


class Ack(msgspec.Struct, array_like=True, tag="k", gc=False):
    transfer_id: str
    seq: int  # the chunk acknowledged; -1 for a Begin or Done
    done: bool  # the receiver has every byte


class Refuse(msgspec.Struct, array_like=True, tag="r", gc=False):
    transfer_id: str
    error: ErrorInfo


class Connected(msgspec.Struct, array_like=True, tag="Q", gc=False):
    """rdma: the receiver's queue pair for this sender, connected to the sender's."""

    transfer_id: str
    qpn: int
    lid: int
    gid: bytes


ToReceiver = Chunk | Begin | Done | Abort | Connect
ToSender = Ack | Refuse | Connected

encode = msgspec.msgpack.Encoder().encode
decode_request = msgspec.msgpack.Decoder(ToReceiver).decode
decode_reply = msgspec.msgpack.Decoder(ToSender).decode
