"""Incremental detokenizer: same text as one full decode, never half a character."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from dsi.recipe.bench_parse import byte_ids, output_ids, plain_tokenizer
from dsi.recipe.detok import IncrementalDetokenizer, byte_table
from dsi.tokenizer import load_tokenizer

TABLE = byte_table()
BYTE_IDS = {TABLE[i][0]: i for i in range(len(TABLE)) if len(TABLE[i]) == 1}


def decode_in_steps(ids: list[int], cuts: list[int]) -> tuple[str, list[str]]:
    d = IncrementalDetokenizer()
    pieces, start = [], 0
    for cut in [*sorted(cuts), len(ids)]:
        pieces.append(d.feed(ids[start:cut]))
        start = max(start, cut)
    pieces.append(d.flush())
    return "".join(pieces), pieces


def test_every_byte_has_a_single_byte_token():
    assert len(BYTE_IDS) == 256


def test_table_matches_decoding_of_each_whole_token():
    tok = load_tokenizer()
    for i in [*range(0, 129280, 997), 128821, 128822, 128825, 128803]:
        data = TABLE[i]
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        assert tok.decode([i]) == text, i


def test_special_tokens_are_skipped_like_decode():
    tok = load_tokenizer()
    ids = [0, *output_ids(["hi"]), 1]
    assert IncrementalDetokenizer().feed(ids) == tok.decode(ids) == "hi"


def test_emoji_split_across_byte_tokens_is_held_back_until_complete():
    ids = byte_ids("a😀b")
    d = IncrementalDetokenizer()
    outs = [d.feed([i]) for i in ids]
    assert outs == ["a", "", "", "", "😀", "b"]
    assert not d.pending


def test_cjk_split_mid_character():
    ids = byte_ids("中文")
    text, pieces = decode_in_steps(ids, [1, 4, 5])
    assert text == "中文"
    assert all("\ufffd" not in p for p in pieces)


def test_incomplete_character_at_the_end_becomes_a_replacement_like_decode():
    ids = byte_ids("ok😀")[:-1]
    d = IncrementalDetokenizer()
    assert d.feed(ids) == "ok"
    assert d.pending
    assert d.flush() == "\ufffd" == load_tokenizer().decode(ids)[2:]


def test_invalid_sequence_between_characters_matches_decode():
    ids = [BYTE_IDS[0xE4], BYTE_IDS[0xB8], *byte_ids("A"), BYTE_IDS[0xFF], *byte_ids("中")]
    text, _ = decode_in_steps(ids, [1, 2, 3])
    assert text == load_tokenizer().decode(ids)


def test_step_cost_does_not_grow_with_output_length():
    d = IncrementalDetokenizer()
    ids = output_ids(["The quick brown fox jumps over the lazy dog. " * 2000])
    d.feed(ids)  # a long history
    one = ids[:1]
    t0 = time.perf_counter()
    for _ in range(2000):
        d.feed(one)
    per_step = (time.perf_counter() - t0) / 2000
    assert per_step < 50e-6  # a full re-decode of the history would take milliseconds


texts = st.lists(
    st.sampled_from([*"ab <>/\n\"'\\", "😀", "🌦️", "中", "文", "é", "｜", "▁", "\u200d", "hello", " 世界"]),
    max_size=30,
).map("".join)


@settings(max_examples=150, deadline=None)
@given(texts, st.booleans(), st.lists(st.integers(0, 200), max_size=8))
def test_streamed_text_equals_full_decode(text, by_bytes, cuts):
    ids = byte_ids(text) if by_bytes else plain_tokenizer().encode(text, add_special_tokens=False).ids
    streamed, pieces = decode_in_steps(ids, cuts)
    assert streamed == load_tokenizer().decode(ids) == text
    assert all("\ufffd" not in p for p in pieces)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 129279), max_size=30), st.lists(st.integers(0, 30), max_size=6))
def test_arbitrary_ids_match_full_decode(ids, cuts):
    # Random ids include stray continuation bytes and control tokens: the lossy rendering of
    # invalid UTF-8 must be the one tokenizers.decode gives.
    streamed, _ = decode_in_steps(ids, cuts)
    assert streamed == load_tokenizer().decode(ids)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from(sorted(BYTE_IDS.values())), max_size=24),
    st.lists(st.integers(0, 24), max_size=6),
)
def test_random_bytes_match_full_decode(ids, cuts):
    streamed, _ = decode_in_steps(ids, cuts)
    assert streamed == load_tokenizer().decode(ids)
