import msgspec
import numpy as np
import pytest
import torch

from dsi.errors import BadMessage, VersionMismatch
from dsi.messages import ALL
from dsi.messages.blob import Blob
from dsi.messages.control import Heartbeat, Load
from dsi.messages.kvstore import BlocksRead, PutBlock
from dsi.transport.wire import HEADER_SIZE, Codec, Kind, pack_header, peek_call_id, unpack_header


def test_header_round_trip_and_checks():
    header = pack_header(Kind.STREAM, 2**63 + 5)
    assert len(header) == HEADER_SIZE
    assert unpack_header(header) == (Kind.STREAM, 2**63 + 5)
    with pytest.raises(VersionMismatch, match="version 9"):
        unpack_header(pack_header(Kind.ASK, 1, version=9))
    with pytest.raises(BadMessage, match="magic"):
        unpack_header(b"XYZ" + header[3:])
    with pytest.raises(BadMessage, match="unknown frame kind"):
        unpack_header(header[:4] + bytes([200]) + header[5:])
    with pytest.raises(BadMessage, match="bytes"):
        unpack_header(header[:-1])
    assert peek_call_id(pack_header(Kind.ASK, 77, version=3)) == 77
    assert peek_call_id(b"short") == 0


def test_every_message_family_round_trips():
    codec = Codec(ALL)
    msg = Heartbeat("decode-0", "decode", "h1", 42, "tcp://127.0.0.1:1", load=Load(running=3, kv_tokens=9000))
    assert codec.decode(codec.encode(msg)) == msg


def test_blobs_travel_as_separate_frames_in_order():
    codec = Codec(ALL)
    a = np.arange(10, dtype=np.float16)
    b = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    frames = codec.encode(BlocksRead([True, True], [Blob.of(a), Blob.of(b)]))
    assert len(frames) == 3 and frames[1].nbytes == a.nbytes and frames[2].nbytes == 12
    out = codec.decode([bytes(f) for f in frames])
    assert np.array_equal(out.data[0].numpy(), a)
    assert torch.equal(out.data[1].torch(), b)


def test_decode_errors_are_bad_message():
    codec = Codec(ALL)
    body, _blob = codec.encode(PutBlock(b"h" * 16, Blob(b"abc")))
    with pytest.raises(BadMessage, match="blob frame 0 is missing"):
        codec.decode([body])
    with pytest.raises(BadMessage):
        codec.decode([msgspec.msgpack.encode(["NoSuchMessage", 1])])
    with pytest.raises(BadMessage):
        codec.decode([msgspec.msgpack.encode(["Heartbeat", 1, 2])])
    with pytest.raises(BadMessage):
        codec.decode([])
    with pytest.raises(BadMessage):
        codec.decode([b"\xc1garbage"])


def test_blob_rejects_inconsistent_shape_and_hidden_copies():
    with pytest.raises(ValueError, match="cannot hold"):
        Blob(b"abc", "float32", (1,))
    with pytest.raises(ValueError, match="contiguous"):
        Blob.of(torch.arange(10)[::2])
    with pytest.raises(ValueError, match="contiguous"):
        Blob.of(np.arange(10)[::2])
    t = torch.zeros(4, 4)
    assert Blob.of(t).address() == t.data_ptr()
