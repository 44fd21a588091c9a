"""OutputParser: reasoning / content / DSML tool calls from token ids, across any chunking."""

from __future__ import annotations

import functools
import itertools
import json
from dataclasses import dataclass, field

import pytest

from dsi.recipe.bench_parse import DSML_ID, END_THINK_ID, THINK_ID, byte_ids, output_ids, tool_calls_block
from dsi.recipe.parser import (
    ContentDelta,
    ControlIds,
    Finish,
    OutputEvent,
    OutputParser,
    ReasoningDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    json_value,
)
from dsi.tokenizer import EOS_ID, load_tokenizer


@dataclass
class Parsed:
    reasoning: str = ""
    content: str = ""
    calls: list[dict] = field(default_factory=list)
    finish: Finish | None = None
    steps: list[list[OutputEvent]] = field(default_factory=list)

    def args(self, i: int = 0) -> dict:
        return json.loads(self.calls[i]["arguments"])


def parse(ids, chunk=1, reason="stop", **kw) -> Parsed:
    kw.setdefault("starts_in_reasoning", True)
    p = OutputParser(tool_id=lambda i: f"call_{i}", **kw)
    out = Parsed()
    for i in range(0, len(ids), chunk):
        out.steps.append(p.feed(ids[i : i + chunk]))
    out.steps.append(p.finish(reason))
    events = [e for step in out.steps for e in step]
    finishes = [e for e in events if isinstance(e, Finish)]
    assert len(finishes) == 1 and events[-1] is finishes[0]
    out.finish = finishes[0]
    for e in events:
        if isinstance(e, ReasoningDelta):
            out.reasoning += e.text
        elif isinstance(e, ContentDelta):
            out.content += e.text
        elif isinstance(e, ToolCallStart):
            assert e.index == len(out.calls)
            out.calls.append({"id": e.id, "name": e.name, "arguments": "", "complete": None})
        elif isinstance(e, ToolCallDelta):
            out.calls[e.index]["arguments"] += e.arguments
        elif isinstance(e, ToolCallEnd):
            assert e.arguments == out.calls[e.index]["arguments"]
            out.calls[e.index]["complete"] = e.complete
    for step in out.steps:  # deltas of one kind are merged within a step
        for a, b in itertools.pairwise(step):
            assert not (type(a) is type(b) and type(a) in (ReasoningDelta, ContentDelta))
            assert not (type(a) is type(b) is ToolCallDelta and a.index == b.index)
    return out


def ids_of(*parts) -> list[int]:
    return output_ids(list(parts))


WEATHER = [("get_weather", {"city": "Paris", "days": 3})]


def test_control_ids_match_the_tokenizer():
    assert ControlIds.from_tokenizer(load_tokenizer()) == ControlIds()


@pytest.mark.parametrize("chunk", [1, 2, 5, 1000])
def test_reasoning_content_and_a_tool_call(chunk):
    ids = ids_of("\n\nLet me think.", END_THINK_ID, "\n\nChecking.\n\n", *tool_calls_block(WEATHER), EOS_ID)
    out = parse(ids, chunk)
    assert out.reasoning == "Let me think."
    assert out.content == "Checking."
    assert [c["name"] for c in out.calls] == ["get_weather"]
    assert out.args() == {"city": "Paris", "days": 3}
    assert out.calls[0]["arguments"] == '{"city": "Paris", "days": 3}'
    assert out.calls[0]["complete"] is True
    assert out.finish == Finish("tool_calls")


def test_v41_spelling_and_several_calls():
    calls = [("a", {}), ("b", {"x": [1, {"y": None}], "s": "t"})]
    out = parse(ids_of("r", END_THINK_ID, *tool_calls_block(calls, "V4.1"), EOS_ID))
    assert [c["name"] for c in out.calls] == ["a", "b"]
    assert out.args(0) == {} and out.calls[0]["arguments"] == "{}"
    assert out.args(1) == {"x": [1, {"y": None}], "s": "t"}


def test_thinking_off_starts_in_content_and_strips_leading_newlines():
    out = parse(ids_of("\n\nHello", EOS_ID), starts_in_reasoning=False)
    assert (out.reasoning, out.content, out.finish) == ("", "Hello", Finish("stop"))


def test_think_token_at_the_start_of_content_opens_reasoning_elsewhere_dropped():
    out = parse(
        ids_of(THINK_ID, "r", END_THINK_ID, "a", THINK_ID, "b", END_THINK_ID, EOS_ID),
        starts_in_reasoning=False,
    )
    assert (out.reasoning, out.content) == ("r", "ab")


def test_eos_is_never_text_and_ends_the_message():
    out = parse(ids_of("r", END_THINK_ID, "done", EOS_ID, "ignored", EOS_ID))
    assert out.content == "done"
    assert "end▁of▁sentence" not in out.content
    assert out.finish == Finish("stop")


def test_dsml_as_ordinary_tokens_stays_content():
    text = '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>'
    ids = ids_of("r", END_THINK_ID, text, EOS_ID)
    assert DSML_ID not in ids
    out = parse(ids)
    assert out.content == text and out.calls == []


def test_real_dsml_without_a_tag_is_content_text():
    out = parse(ids_of("r", END_THINK_ID, "a ", DSML_ID, " b", EOS_ID))
    assert out.content == "a ｜DSML｜ b"


def test_malformed_block_before_any_invoke_falls_back_to_content():
    out = parse(ids_of("r", END_THINK_ID, "x\n\n<", DSML_ID, "tool_callz> y", EOS_ID))
    assert out.content == "x\n\n<｜DSML｜tool_callz> y" and out.calls == []
    out = parse(ids_of("r", END_THINK_ID, "x <", DSML_ID, "tool_calls>\nhello", EOS_ID))
    assert out.content == "x <｜DSML｜tool_calls>\nhello"
    assert out.finish == Finish("stop")


def test_malformed_block_after_a_call_closes_it_and_ignores_the_rest():
    ids = ids_of("r", END_THINK_ID, "<", DSML_ID, "tool_calls>\n<", DSML_ID, 'invoke name="f">\n<', DSML_ID)
    ids += ids_of(
        'parameter name="k" string="true">v</', DSML_ID, "parameter>\n<", DSML_ID, "bogus>", "more", EOS_ID
    )
    out = parse(ids)
    assert out.content == ""
    assert out.args() == {"k": "v"} and out.calls[0]["complete"] is False
    assert out.finish == Finish("tool_calls")


def test_text_after_the_block_is_ignored():
    out = parse(ids_of("r", END_THINK_ID, *tool_calls_block(WEATHER), "\n\ntrailing", EOS_ID))
    assert out.content == "" and len(out.calls) == 1


def test_tools_not_declared_keeps_dsml_as_text():
    out = parse(ids_of("r", END_THINK_ID, *tool_calls_block(WEATHER), EOS_ID), parse_tools=False)
    assert out.calls == [] and out.content.startswith("<｜DSML｜tool_calls>")


@pytest.mark.parametrize(
    "value",
    [
        'quote " and \\ backslash',
        "new\nline\n",
        "  padded  ",
        "emoji 😀 中文",
        "</｜DSML｜parameter> inside",
        "ends with <",
        "ends with </",
        "<",
        "",
    ],
)
def test_string_parameter_values_are_raw_strings(value):
    for chunk in (1, 3):
        out = parse(ids_of("r", END_THINK_ID, *tool_calls_block([("f", {"v": value})]), EOS_ID), chunk)
        assert out.args() == {"v": value}


@pytest.mark.parametrize("value", [0, -1.5e-3, True, None, [1, "a"], {"n": {"m": [{}]}}, "x"])
def test_non_string_parameter_values_are_json(value):
    parts = ["r", END_THINK_ID, "<", DSML_ID, "tool_calls>\n<", DSML_ID, 'invoke name="f">\n<', DSML_ID]
    parts += ['parameter name="v" string="false">', json.dumps(value), "</", DSML_ID, "parameter>\n</"]
    parts += [DSML_ID, "invoke>\n</", DSML_ID, "tool_calls>", EOS_ID]
    assert parse(ids_of(*parts)).args() == {"v": value}


def test_invalid_json_value_becomes_a_string():
    assert json_value(" 12 ") == "12"
    assert json_value("not json") == '"not json"'
    assert json_value("NaN") == '"NaN"'
    assert json_value("[1, 2") == '"[1, 2"'


def test_only_possible_marker_starts_are_held_back():
    p = OutputParser(starts_in_reasoning=False)
    assert p.feed(ids_of("Hello")) == [ContentDelta("Hello")]
    assert p.feed(ids_of(" world\n\n")) == [ContentDelta(" world")]
    assert p.feed(ids_of("<")) == []
    assert p.feed(ids_of("b")) == [ContentDelta("\n\n<b")]
    assert p.feed(byte_ids("😀")[:2]) == []
    assert p.feed(byte_ids("😀")[2:]) == [ContentDelta("😀")]


def test_held_back_text_flushes_at_the_end():
    out = parse(ids_of("r", END_THINK_ID, "tail\n\n<"), reason="stop")
    assert out.content == "tail\n\n<"
    out = parse(ids_of("r\n\n"), reason="length")
    assert out.reasoning == "r\n\n" and out.finish == Finish("length")
    out = parse([*ids_of("r", END_THINK_ID, "x"), *byte_ids("😀")[:3]], reason="length")
    assert out.content == "x\ufffd"


def test_newlines_before_end_of_thinking_are_dropped():
    assert parse(ids_of("r\n\n", END_THINK_ID, "c", EOS_ID)).reasoning == "r"


def test_stop_strings_apply_to_content_only():
    out = parse(ids_of("say STOP here", END_THINK_ID, "hello STOP world", EOS_ID), stop=["STOP"])
    assert out.reasoning == "say STOP here"
    assert out.content == "hello "
    assert out.finish == Finish("stop_sequence", "STOP")


def test_stop_string_split_across_steps_and_partial_prefix_released():
    out = parse(ids_of("r", END_THINK_ID, "abc", "ST", "OX", "STO", "P", "z", EOS_ID), stop=["STOP"])
    assert out.content == "abcSTOX"
    out = parse(ids_of("r", END_THINK_ID, "abST"), stop=["STOP"], reason="length")
    assert out.content == "abST" and out.finish == Finish("length")


def test_overlapping_stop_strings_first_completed_wins_in_any_chunking():
    for chunk in (1, 2, 100):
        out = parse(byte_ids("xabcd"), chunk, stop=["abcd", "bc"], starts_in_reasoning=False)
        assert out.content == "xa" and out.finish == Finish("stop_sequence", "bc")


def test_stop_string_in_text_released_from_a_false_block():
    ids = ids_of("r", END_THINK_ID, "x <", DSML_ID, "tool_calls>\nSTOP")
    for reason in ("length", "stop"):
        out = parse(ids, reason=reason, stop=["STOP"])  # parse() checks for a single Finish
        assert out.content == "x <｜DSML｜tool_calls>\n" and out.finish == Finish("stop_sequence", "STOP")
    out = parse(ids_of("r", END_THINK_ID, "x <", DSML_ID, "bogus STOP", EOS_ID), stop=["STOP"])
    assert out.content == "x <｜DSML｜bogus " and out.finish == Finish("stop_sequence", "STOP")


def test_tokens_after_a_stop_string_are_ignored():
    p = OutputParser(starts_in_reasoning=False, stop=["END"])
    events = p.feed(ids_of("ok END", "more", EOS_ID))
    assert events == [ContentDelta("ok "), Finish("stop_sequence", "END")]
    assert p.finished and p.feed(ids_of("x")) == [] and p.finish("length") == []


def _cut_call():
    return ["r", END_THINK_ID, "<", DSML_ID, "tool_calls>\n<", DSML_ID, 'invoke name="f">\n<', DSML_ID]


def test_length_inside_a_string_value_closes_the_call():
    out = parse(ids_of(*_cut_call(), 'parameter name="a" string="true">abc "q'), reason="length")
    assert out.finish == Finish("length")
    assert out.args() == {"a": 'abc "q'} and out.calls[0]["complete"] is False


def test_length_inside_a_json_value_and_between_parameters():
    out = parse(ids_of(*_cut_call(), 'parameter name="a" string="false">[1, 2'), reason="length")
    assert out.args() == {"a": "[1, 2"}
    out = parse(
        ids_of(*_cut_call(), 'parameter name="a" string="false">7</', DSML_ID, "parameter>\n<"),
        reason="length",
    )
    assert out.args() == {"a": 7} and out.finish == Finish("length")


def test_length_inside_a_tag_before_any_call_releases_the_text():
    out = parse(
        ids_of("r", END_THINK_ID, "x\n\n<", DSML_ID, "tool_calls>\n<", DSML_ID, "invoke na"), reason="length"
    )
    assert out.calls == [] and out.content == "x\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke na"
    assert out.finish == Finish("length")


def test_length_after_the_block_closed_is_tool_calls():
    out = parse(ids_of("r", END_THINK_ID, *tool_calls_block(WEATHER)), reason="length")
    assert out.finish == Finish("tool_calls")


def test_eos_inside_a_call_closes_it_incomplete():
    out = parse(ids_of(*_cut_call(), 'parameter name="a" string="true">v', EOS_ID))
    assert out.args() == {"a": "v"} and out.calls[0]["complete"] is False
    assert out.finish == Finish("tool_calls")


@pytest.mark.parametrize("reason", ["abort", "error"])
def test_abort_and_error_close_open_calls(reason):
    out = parse(ids_of(*_cut_call(), 'parameter name="a" string="true">v'), reason=reason)
    assert out.finish == Finish(reason) and out.args() == {"a": "v"}


def test_reasoning_tokens_are_counted():
    ids = ids_of("one two three", END_THINK_ID, "answer", EOS_ID)
    p = OutputParser(starts_in_reasoning=True)
    for i in ids:
        p.feed([i])
    assert p.reasoning_tokens == len(ids_of("one two three"))


# -- against deepseek-recipe's StreamProcessor, on well-formed outputs -------------------------


@functools.cache
def _recipe_tokenizer():
    import deepseek_recipe as r

    from dsi.tokenizer import tokenizer_path

    return r.Tokenizer.from_file(str(tokenizer_path()))


def _recipe_parse(ids: list[int]) -> dict:
    r = pytest.importorskip("deepseek_recipe")

    body = {
        "model": "DeepSeek-V4-Pro",
        "messages": [{"role": "user", "content": "q"}],
        "stream": True,
        "tools": [
            {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in "fgh"
        ],
    }
    req = r.ChatCompletionRequest(body).convert(r.ConversionOptions())
    gen = r.ChatCompletionRequest.chunk_generator(req, "id", "DeepSeek-V4-Pro")
    proc = r.StreamProcessor(gen, req.parsing_options, _recipe_tokenizer())
    chunks = [proc.push(r.InferenceChunk.ready())]
    chunks += [proc.push(r.InferenceChunk.tokens([i])) for i in ids if i != EOS_ID]
    chunks += [proc.push(r.InferenceChunk.finish(r.InferenceFinishReason.Stop)), proc.finish()]
    out = {"reasoning": "", "content": "", "calls": []}
    for c in (json.loads(c.to_json()) for step in chunks for c in step):
        for choice in c["choices"]:
            d = choice["delta"]
            out["reasoning"] += d.get("reasoning_content") or ""
            out["content"] += d.get("content") or ""
            for t in d.get("tool_calls") or []:
                if "id" in t:
                    out["calls"].append({"name": t["function"]["name"], "arguments": ""})
                out["calls"][t["index"]]["arguments"] += t["function"].get("arguments", "")
    return out


OUTPUTS = [
    ["\n\nThinking about 中文 and 😀.", END_THINK_ID, "Answer: 42.", EOS_ID],
    ["r", END_THINK_ID, "Let me call.\n\n", *tool_calls_block([("f", {"q": 'a "b"\nc', "n": 1.5})]), EOS_ID],
    [
        "r",
        END_THINK_ID,
        *tool_calls_block([("f", {}), ("g", {"deep": {"a": [1, [2, {"b": None}]]}})]),
        EOS_ID,
    ],
    [
        "r",
        END_THINK_ID,
        "x",
        *tool_calls_block([("h", {"t": "</｜DSML｜parameter>, <b>, 🌧️"})], "V4.1"),
        EOS_ID,
    ],
    ["a\nb", END_THINK_ID, "c\n\nd\n", EOS_ID],
]


@pytest.mark.parametrize("parts", OUTPUTS)
def test_same_result_as_deepseek_recipe(parts):
    ids = output_ids(parts)
    ours = parse(ids)
    theirs = _recipe_parse(ids)
    assert ours.reasoning == theirs["reasoning"]
    assert ours.content == theirs["content"]
    assert [c["name"] for c in ours.calls] == [c["name"] for c in theirs["calls"]]
    for mine, other in zip(ours.calls, theirs["calls"], strict=True):
        assert json.loads(mine["arguments"]) == json.loads(other["arguments"])
