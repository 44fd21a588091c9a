"""Encoding: client text never yields a control-token id, and cutting long text into chunks
at certain pre-tokenizer boundaries gives exactly the ids of encoding it whole."""

from __future__ import annotations

import collections
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsi.recipe import Recipe
from dsi.recipe.bench_encode import chinese_text, english_text
from dsi.recipe.encode import MissingControlToken, PromptEncoder, cut, default_encoder
from dsi.recipe.segments import Control, RenderedPrompt


@pytest.fixture(scope="module")
def encoder() -> PromptEncoder:
    return default_encoder()


def test_control_ids_are_the_documented_ones(encoder: PromptEncoder) -> None:
    ids = {c.name: i for c, i in encoder.control_ids.items()}
    assert ids == {
        "BOS": 0,
        "EOS": 1,
        "USER": 128803,
        "ASSISTANT": 128804,
        "THINK": 128821,
        "END_THINK": 128822,
        "DSML": 128825,
        "LATEST_REMINDER": 128828,
        "IMAGE": encoder.added_tokens["<｜image｜>"],
    }
    assert Control.SYSTEM not in encoder.control_ids  # a V4.1 token
    assert len(encoder.added_tokens) == 1283


def test_a_missing_control_token_is_named_or_stands_in(encoder: PromptEncoder) -> None:
    """``<｜System｜>`` is not in the V4 vocabulary: encode raises, or puts the stand-in id in its
    place (one id, as in a vocabulary that has it); ``missing`` lists it once."""
    segments = [
        Control.BOS,
        Control.SYSTEM,
        "sys",
        Control.SYSTEM,
        "s2",
        Control.USER,
        "hi",
        Control.ASSISTANT,
    ]
    prompt = RenderedPrompt.from_segments(segments)
    assert encoder.missing(prompt) == (Control.SYSTEM,)
    with pytest.raises(MissingControlToken) as info:
        encoder.encode(prompt)
    assert info.value.token is Control.SYSTEM and info.value.tokenizer == encoder.path
    ids = encoder.encode(prompt, stand_in=-1)
    sys_ids, s2_ids, hi_ids = (encoder.encode_text(t) for t in ("sys", "s2", "hi"))
    assert ids == [0, -1, *sys_ids, -1, *s2_ids, 128803, *hi_ids, 128804]
    assert encoder.missing(RenderedPrompt.from_segments([Control.BOS, "x"])) == ()


def test_no_added_token_spelling_encodes_to_an_added_id(encoder: PromptEncoder) -> None:
    added = set(encoder.added_tokens.values())
    for spelling in encoder.added_tokens:
        for text in (spelling, f"a{spelling}b", f" {spelling}\n{spelling}{spelling}", f"中{spelling}1"):
            assert not added & set(encoder.encode_text(text)), (spelling, text)


def test_every_field_full_of_control_spellings_yields_only_template_ids(encoder: PromptEncoder) -> None:
    every = "".join(encoder.added_tokens)  # all 1283 spellings back to back, in every client field
    args = json.dumps({every: every, "n": [every]})
    body = {
        "model": "DeepSeek-V4-Pro",
        "messages": [
            {"role": "system", "content": every},
            {"role": "developer", "content": every},
            {"role": "user", "content": [{"type": "text", "text": every}, {"type": "text", "text": every}]},
            {
                "role": "assistant",
                "content": every,
                "reasoning_content": every,
                "tool_calls": [
                    {"id": every, "type": "function", "function": {"name": "f", "arguments": args}}
                ],
            },
            {"role": "tool", "tool_call_id": every, "content": every},
            {"role": "latest_reminder", "content": every},
            {"role": "user", "content": every},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "f",
                    "description": every,
                    "parameters": {
                        "type": "object",
                        "properties": {every: {"type": "string", "description": every}},
                    },
                },
            }
        ],
    }
    req = Recipe().prepare("chat", body)
    ids = collections.Counter(req.prompt_token_ids)
    controls = collections.Counter(s for s in req.prompt.segments if isinstance(s, Control))
    for spelling, token_id in encoder.added_tokens.items():
        control = next((c for c in Control if c.value == spelling), None)
        assert ids[token_id] == (controls[control] if control else 0), spelling


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(sorted(default_encoder().added_tokens)) | st.text(max_size=6), max_size=12))
def test_random_text_with_spellings_has_no_added_ids(pieces: list[str]) -> None:
    enc = default_encoder()
    assert not set(enc.added_tokens.values()) & set(enc.encode_text("".join(pieces)))


# -- chunking ------------------------------------------------------------------------------

_ALPHABET = (
    "ab Zq \n\n\r\t  .,!?-'\"()[]{}0123456789１２中文字の日本カタカナ한국ɑé\u0301😀️‍🚀\u00a0\u3000▁｜<>/"
)


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=_ALPHABET, max_size=400), st.integers(1, 40))
def test_cut_text_encodes_like_the_whole(text: str, size: int) -> None:
    enc = default_encoder()
    whole = enc._plain.encode(text, add_special_tokens=False).ids
    chunks = cut(text, size)
    assert "".join(chunks) == text
    assert [i for c in chunks for i in enc._plain.encode(c, add_special_tokens=False).ids] == whole


@pytest.mark.parametrize("make", [english_text, chinese_text])
def test_long_text_chunked_in_parallel_matches(encoder: PromptEncoder, make) -> None:
    text = make(300_000, seed=7)
    assert len(cut(text)) >= 3
    assert encoder.encode_texts([text, "tail"]) == [
        encoder._plain.encode(text, add_special_tokens=False).ids,
        encoder._plain.encode("tail", add_special_tokens=False).ids,
    ]


def test_realistic_mixed_text_cuts_exactly(encoder: PromptEncoder) -> None:
    rng = random.Random(3)
    lines = [
        "def f(x):\n    return x  # ok",
        "Hello, world! 123456789",
        "  indented\ttabs  ",
        "中文，句子。",
        "mixed中文and English",
        "emoji 🙂🙂 and ZWJ 👩‍💻",
        "trailing spaces   ",
        "",
        "URL https://a.b/c?d=1",
    ]
    text = "\n".join(rng.choice(lines) for _ in range(20_000))
    pieces = cut(text, 256)
    assert len(pieces) > 100
    whole = encoder._plain.encode(text, add_special_tokens=False).ids
    assert [i for p in pieces for i in encoder._plain.encode(p, add_special_tokens=False).ids] == whole


def test_fixed_template_texts_encode_as_the_tokenizer_does(encoder: PromptEncoder) -> None:
    assert encoder.fixed  # the effort preambles
    for text, ids in encoder.fixed.items():
        assert list(ids) == encoder._plain.encode(text, add_special_tokens=False).ids
        got = encoder.encode_texts([text, text + " "])
        assert got == [list(ids), encoder._plain.encode(text + " ", add_special_tokens=False).ids]
        got[0].append(-1)  # a caller's list is its own
        assert encoder.encode_text(text) == list(ids)
