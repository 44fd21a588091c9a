"""Frame layout of the control plane and the codec between messages and frames.

One logical message is one ZeroMQ multipart message::

    [header: 13 B][body: msgpack][blob 0][blob 1]...

    header = b"DSI" | version: u8 | kind: u8 | call_id: u64 (network order)

``version`` is the protocol version the frame is written in; which ones a process accepts, and
how two processes settle on one, is dsi.messages.version.

``kind`` says what the frame does (an ask, a reply, a stream item, ...); ``call_id`` pairs
replies with calls and is 0 for tells. Messages without blobs that leave for the same peer in
one turn of the event loop travel as one BATCH message (``transport.sockets.FramePump``)::

    [header(BATCH, n)][header 1][body 1]...[header n][body n]

which the receiving pump splits back into ``n`` messages before anything else sees them. Blob frames follow the body in the order the encoder met
them; the body refers to them by index. Nothing is pickled: the body is msgpack, blobs are raw.
"""

from __future__ import annotations

import enum
import math
import struct
from collections.abc import Sequence
from typing import Any

import msgspec

from dsi.errors import BadMessage, ErrorInfo
from dsi.messages.blob import Blob
from dsi.messages.version import CURRENT, PROTOCOL_VERSION, Protocol

MAGIC = b"DSI"
_HEADER = struct.Struct("!3sBBQ")
HEADER_SIZE = _HEADER.size
_BLOB_EXT = 1
# [frame index, dtype, shape]; a Decoder built once (a ``type=`` argument is re-analysed per call).
_BLOB_REF = msgspec.msgpack.Decoder(tuple[int, str, tuple[int, ...]])
_MAX_BLOBS = 4096


class Kind(enum.IntEnum):
    HELLO = 1  # client -> server: Hello, answered with REPLY(Welcome) or ERROR
    ASK = 2  # expects exactly one REPLY or ERROR
    TELL = 3  # no answer unless it is malformed
    STREAM = 4  # expects ITEM* then END, or ERROR
    CANCEL = 5  # client -> server: stop the stream / ask with this call_id
    REPLY = 6
    ERROR = 7  # body is ErrorInfo
    ITEM = 8
    END = 9
    PUBLISH = 10  # pub/sub payload (call_id = sequence number)
    BATCH = 11  # several blob-free messages to one peer in one: call_id = their count (see below)


_KINDS = {int(kind): kind for kind in Kind}


def pack_header(kind: Kind, call_id: int, version: int = PROTOCOL_VERSION) -> bytes:
    return _HEADER.pack(MAGIC, version, kind, call_id)


def read_header(
    frame: bytes | memoryview, protocol: Protocol = CURRENT, any_version: Kind | None = None
) -> tuple[int, Kind, int]:
    """(version, kind, call_id) of a header frame; raises BadMessage, or VersionMismatch for a
    version ``protocol`` does not accept, unless the frame's kind is ``any_version`` (a Hello at
    a server, an ERROR at a client: their bodies read the same in every version)."""
    if len(frame) != HEADER_SIZE:
        raise BadMessage(f"header frame is {len(frame)} bytes, expected {HEADER_SIZE}")
    magic, version, kind, call_id = _HEADER.unpack(frame)
    if magic != MAGIC:
        raise BadMessage("header does not start with the DSI magic")
    if kind != any_version:
        protocol.check(version)
    member = _KINDS.get(kind)  # a dict lookup: Kind(kind) costs a microsecond per frame
    if member is None:
        raise BadMessage(f"unknown frame kind {kind}")
    return version, member, call_id


def unpack_header(frame: bytes | memoryview, protocol: Protocol = CURRENT) -> tuple[Kind, int]:
    """(kind, call_id) of a header frame of a version ``protocol`` accepts; raises BadMessage /
    VersionMismatch."""
    _, kind, call_id = read_header(frame, protocol)
    return kind, call_id


def peek_call_id(frame: bytes | memoryview) -> int:
    """Best-effort call id of a possibly malformed header (0 when unreadable)."""
    return _HEADER.unpack(frame)[3] if len(frame) == HEADER_SIZE else 0


def peek_version(frame: bytes | memoryview, default: int = PROTOCOL_VERSION) -> int:
    """Best-effort version of a possibly malformed header (``default`` when unreadable): the
    version to answer it in, so that its sender can read the error."""
    if len(frame) != HEADER_SIZE or bytes(frame[:3]) != MAGIC:
        return default
    return frame[3]


class Codec:
    """Encodes messages of any type and decodes one tagged union, with Blob frames.

    ``types`` are the message classes this side accepts; anything else is a BadMessage. Not
    thread-safe: one codec per event loop.
    """

    def __init__(self, types: Sequence[type]) -> None:
        self._out: list[Any] = []
        self._in: Sequence[Any] = ()
        self._encoder = msgspec.msgpack.Encoder(enc_hook=self._enc_hook)
        union = types[0] if len(types) == 1 else _union(types)
        self._decoder = msgspec.msgpack.Decoder(union, ext_hook=self._ext_hook, dec_hook=_dec_hook)
        self._error_decoder = msgspec.msgpack.Decoder(ErrorInfo)
        self._error_encoder = msgspec.msgpack.Encoder()

    def encode(self, msg: Any) -> list[Any]:
        """[body, *blob buffers] for a message; blob buffers are zero-copy views."""
        self._out = out = []
        try:
            body = self._encoder.encode(msg)
        finally:
            self._out = []
        return [body, *out]

    def decode(self, frames: Sequence[Any]) -> Any:
        """The typed message of [body, *blob frames]; raises BadMessage with the reason."""
        if not frames:
            raise BadMessage("message has no body frame")
        self._in = frames[1:]
        try:
            return self._decoder.decode(frames[0])
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise BadMessage(f"cannot decode message: {exc}") from None
        except (ValueError, TypeError, IndexError) as exc:
            raise BadMessage(f"bad blob reference: {exc}") from None
        finally:
            self._in = ()

    def encode_error(self, info: ErrorInfo) -> bytes:
        return self._error_encoder.encode(info)

    def decode_error(self, body: Any) -> ErrorInfo:
        try:
            return self._error_decoder.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return ErrorInfo("bad_message", f"undecodable error reply: {exc}")

    def _enc_hook(self, obj: Any) -> Any:
        if isinstance(obj, Blob):
            self._out.append(obj.buffer)
            return msgspec.msgpack.Ext(
                _BLOB_EXT, msgspec.msgpack.encode((len(self._out) - 1, obj.dtype, obj.shape))
            )
        raise NotImplementedError(f"{type(obj).__name__} cannot go on the wire (wrap buffers in Blob)")

    def _ext_hook(self, code: int, data: memoryview) -> Any:
        if code != _BLOB_EXT:
            raise ValueError(f"unknown extension type {code}")
        index, dtype, shape = _BLOB_REF.decode(data)
        if not 0 <= index < min(len(self._in), _MAX_BLOBS):
            raise IndexError(f"blob frame {index} is missing")
        frame = self._in[index]
        buffer = memoryview(getattr(frame, "buffer", frame))
        # Blob checks the size in int64, where 2**32 x 2**32 elements wrap to 0 and "fit" 0 bytes.
        if any(dim < 0 for dim in shape) or math.prod(shape) > buffer.nbytes:
            raise ValueError(f"blob frame {index} of {buffer.nbytes} bytes cannot hold shape {list(shape)}")
        return Blob(buffer, dtype, shape, owner=frame)


def _dec_hook(tp: type, obj: Any) -> Any:
    if tp is Blob and isinstance(obj, Blob):
        return obj
    raise TypeError(f"expected {tp.__name__}, got {type(obj).__name__}")


def _union(types: Sequence[type]) -> Any:
    union = types[0]
    for tp in types[1:]:
        union = union | tp
    return union
