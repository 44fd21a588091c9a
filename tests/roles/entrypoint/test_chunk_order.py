"""ChunkOrder: numbered chunks in order pass, a repeated one is dropped, a missing one is a gap."""

import pytest

from dsi.messages.gateway import TokenChunk
from dsi.roles.entrypoint.chunk_order import ChunkGap, ChunkOrder


def chunk(seq: int, finish: str = "") -> TokenChunk:
    return TokenChunk("r", [seq], finish, seq=seq)


def test_chunks_in_order_pass_and_a_finished_stream_ends_cleanly():
    order = ChunkOrder()
    assert [order.take(chunk(i, "length" if i == 3 else "")) for i in (1, 2, 3)] == [True] * 3
    order.ended("r")


def test_a_repeated_chunk_is_dropped():
    order = ChunkOrder()
    assert [order.take(chunk(i)) for i in (1, 2, 2, 1, 3)] == [True, True, False, False, True]
    assert order.duplicates == 2


def test_a_missing_chunk_is_a_gap():
    order = ChunkOrder()
    order.take(chunk(1))
    with pytest.raises(ChunkGap, match="chunk 3 arrived where 2 was due; 1 lost"):
        order.take(chunk(3))


def test_a_numbered_stream_that_ends_without_its_last_chunk_is_a_gap():
    order = ChunkOrder()
    order.take(chunk(1))
    with pytest.raises(ChunkGap, match="ended after chunk 1 without its last one"):
        order.ended("r")


def test_unnumbered_chunks_are_taken_as_they_come():
    order = ChunkOrder()
    assert all(order.take(chunk(0)) for _ in range(3))
    order.ended("r")  # an old sender's stream: nothing to tell
