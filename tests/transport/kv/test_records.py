"""Sealed records: byte-exact round trips, one counter per direction that only grows, and every
replayed, reordered, reflected or altered record rejected without changing the opener."""

from __future__ import annotations

import os

import numpy as np
import pytest

from dsi.transport.kv.records import HEAD_BYTES, Opener, RecordRejected, Scratch, Sealer


def _pair() -> tuple[Sealer, Opener]:
    key = os.urandom(32)
    return Sealer(key), Opener(key)


def _parts() -> list[memoryview]:
    data = np.random.default_rng(0).integers(0, 256, 300_000, dtype=np.uint8)
    return [memoryview(data[:1000]), memoryview(data[1000:200_000]), memoryview(data[200_000:])]


def test_header_and_parts_round_trip_and_nothing_is_in_clear():
    sealer, opener = _pair()
    parts = _parts()
    frames = sealer.seal(b"header bytes", parts)
    assert len(frames) == 2 and b"header bytes" not in frames[0]
    assert bytes(parts[1][:64]) not in bytes(frames[1])
    header, payload = opener.open(frames, Scratch())
    assert header == b"header bytes"
    assert bytes(payload[0]) == b"".join(bytes(p) for p in parts)
    assert opener.open(sealer.seal(b"no payload"), Scratch()) == (b"no payload", [])


def test_counters_grow_per_record_and_a_nonce_is_never_reused():
    sealer, opener = _pair()
    counters = []
    for payload in ([], _parts(), [], _parts()):
        counters.append(sealer.counter)
        opener.open(sealer.seal(b"h", payload), Scratch())
    assert counters == [0, 1, 3, 4]  # a record with a payload takes two nonces
    assert sealer.counter == 6 and opener.last == 5


def test_the_two_directions_have_their_own_keys_and_counters():
    to_receiver, at_receiver = _pair()
    to_sender, at_sender = _pair()
    request = to_receiver.seal(b"chunk", _parts())
    reply = to_sender.seal(b"ack")
    assert to_receiver.counter == 2 and to_sender.counter == 1  # independent counters
    with pytest.raises(RecordRejected):
        at_sender.open(request, Scratch())  # reflected back at its sender: wrong key
    at_receiver.open(request, Scratch())
    at_sender.open(reply, Scratch())


def test_replayed_or_reordered_records_are_rejected():
    sealer, opener = _pair()
    first, second = sealer.seal(b"1"), sealer.seal(b"2")
    opener.open(second, Scratch())
    with pytest.raises(RecordRejected, match="replayed or reordered"):
        opener.open(first, Scratch())
    with pytest.raises(RecordRejected):
        opener.open(second, Scratch())
    assert opener.last == 1


@pytest.mark.parametrize("where", ["counter", "length", "header", "payload", "tag"])
def test_any_altered_byte_is_rejected_and_changes_nothing(where):
    sealer, opener = _pair()
    frames = sealer.seal(b"header", _parts())
    first, payload = bytearray(frames[0]), bytearray(frames[1].tobytes())
    at = {"counter": 12, "length": HEAD_BYTES - 1, "header": HEAD_BYTES + 2, "tag": len(first) - 1}
    if where == "payload":
        payload[5000] ^= 1
    else:
        first[at[where]] ^= 1
    with pytest.raises(RecordRejected):
        opener.open([bytes(first), payload], Scratch())
    assert opener.last == -1
    assert opener.open(frames, Scratch())[0] == b"header"  # the authentic record still opens


def test_a_dropped_or_added_frame_is_rejected():
    sealer, opener = _pair()
    frames = sealer.seal(b"header", _parts())
    with pytest.raises(RecordRejected):
        opener.open(frames[:1], Scratch())
    with pytest.raises(RecordRejected):
        opener.open([*frames, b"extra"], Scratch())
    with pytest.raises(RecordRejected):
        opener.open([frames[0], frames[1][:-1]], Scratch())
