"""Specs, the compiler and its cache, and the grammars against exact token sequences: the DSML
tool-call grammar accepts deepseek-recipe's own rendering of assistant tool calls, id for id."""

import json

import deepseek_recipe as dr
import pytest
from tokenizers import Tokenizer

from dsi.structured import GrammarCompiler, SpecError, StructuredSpec, default_compiler
from dsi.structured.vocab import DSML_ID
from dsi.tokenizer import EOS_ID, load_tokenizer, tokenizer_path
from tests.dsi.structured.helpers import allowed, is_allowed

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "unit": {"enum": ["c", "f"]},
        "opts": {"type": "object", "properties": {"u": {"type": "string"}}},
    },
    "required": ["city"],
}
TOOLS = [
    {"name": "get_weather", "parameters": WEATHER},
    {"name": "noargs", "parameters": {"type": "object", "properties": {}}},
    {"name": "free", "parameters": {"type": "object"}},
]
CALLS = [
    ("get_weather", {"city": "Paris </div> <x>\nline 2", "days": 3, "opts": {"u": "c"}}),
    ("get_weather", {"city": "Rome", "unit": "f"}),
    ("noargs", {}),
    ("free", {"a": "x", "b": [1, {"c": None}], "d": 1.5}),
]


def _ids(text: str) -> list[int]:
    return load_tokenizer().encode(text, add_special_tokens=False).ids


def _text_ids(text: str) -> list[int]:
    """Ordinary BPE ids only: control-token spellings in ``text`` stay text (RECIPE.md)."""
    data = json.loads(tokenizer_path().read_text(encoding="utf-8"))
    data["added_tokens"] = []
    return Tokenizer.from_str(json.dumps(data)).encode(text, add_special_tokens=False).ids


def _accepts(spec: StructuredSpec, ids: list[int]) -> bool:
    """Every id passes the mask and is accepted; then the output may end (EOS allowed)."""
    c = default_compiler().constraint(spec)
    for token in ids:
        if not is_allowed(c, token) or not c.accept(token):
            return False
    return is_allowed(c, EOS_ID)


@pytest.fixture(scope="module")
def rendered_calls():
    """The ids deepseek-recipe renders for an assistant turn holding CALLS, from after
    ``</think>`` up to (not including) EOS; and where the ``tool_calls>\\n`` opener ends."""
    tools = [dr.ToolDefinition(t["name"], None, t["parameters"]) for t in TOOLS]
    calls = [dr.ToolCall(f"c{i}", name, json.dumps(args)) for i, (name, args) in enumerate(CALLS)]
    msgs = [
        dr.UserMessage("hi"),
        dr.AssistantMessage("", tool_calls=calls),
        *[dr.ToolMessage("ok", f"c{i}") for i in range(len(calls))],
    ]
    encoding = dr.DeepseekV4Encoding().with_tokenizer(dr.Tokenizer.from_file(str(tokenizer_path())))
    ids = encoding.encode(dr.Conversation(msgs, tools=tools, thinking_mode=False))
    start = ids.index(128822, ids.index(128804)) + 1  # </think> of the first assistant turn
    out = ids[start : ids.index(EOS_ID, start)]
    decode = load_tokenizer().decode
    opener = next(
        k for k in range(len(out)) if decode(out[:k], skip_special_tokens=False).endswith("tool_calls>\n")
    )
    return out, opener


def test_spec_is_hashable_and_compares_by_value():
    a = StructuredSpec.json_schema({"type": "object", "properties": {"b": {}, "a": {}}})
    b = StructuredSpec.json_schema('{"type": "object", "properties": {"b": {}, "a": {}}}')
    assert a == b and hash(a) == hash(b)
    assert a != StructuredSpec.json_schema(
        {"type": "object", "properties": {"a": {}, "b": {}}}
    )  # order matters


def test_cache_shares_grammar_across_after_think():
    compiler = GrammarCompiler(capacity=2)
    spec = StructuredSpec.for_regex("[0-9]+")
    compiler.constraint(spec)
    compiler.constraint(StructuredSpec.for_regex("[0-9]+", after_think=True))
    assert (compiler.misses, compiler.hits) == (1, 1)
    compiler.check(StructuredSpec.for_regex("a"))
    compiler.check(StructuredSpec.for_regex("b"))  # evicts [0-9]+
    compiler.check(spec)
    assert compiler.misses == 4


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        (StructuredSpec("json_schema", schema="{not json"), "not valid JSON"),
        (StructuredSpec("json_schema", schema="[1]"), "object or a boolean"),
        (
            StructuredSpec.json_schema({"type": "object", "properties": {"a": {"type": "strnig"}}}),
            "cannot compile",
        ),
        (StructuredSpec.for_regex(""), "empty"),
        (StructuredSpec.for_regex("a(b"), "cannot compile"),
        (StructuredSpec.tool_call([]), "no tools"),
        (StructuredSpec.tool_call(TOOLS, "nope"), "not among the tools"),
        (StructuredSpec.tool_call([TOOLS[0], TOOLS[0]]), "unique"),
        (StructuredSpec.tool_call([{"name": 'a"b', "parameters": {}}]), "tool name"),
        (StructuredSpec.tool_call([{"name": "f", "parameters": {"type": "array"}}]), "object schema"),
    ],
)
def test_bad_specs_raise_spec_error(spec, match):
    with pytest.raises(SpecError, match=match):
        default_compiler().check(spec)


def test_json_uses_the_renderer_spelling():
    spec = StructuredSpec.json_schema(
        {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array"}}}
    )
    assert _accepts(spec, _ids('{"a": 1, "b": [1, 2]}'))
    assert not _accepts(spec, _ids('{"a":1,"b":[1,2]}'))
    assert not _accepts(spec, _ids('{"a": 1, "b": [1, 2]} '))


def test_regex_is_matched_in_full():
    spec = StructuredSpec.for_regex("[a-z]{3}-[0-9]{2}")
    assert _accepts(spec, _ids("abc-12"))
    assert not _accepts(spec, _ids("abc-1"))
    c = default_compiler().constraint(spec)
    assert all(c.accept(t) for t in _ids("abc-12")) and c.is_done()  # nothing can follow


@pytest.mark.parametrize("choice", ["auto", "required-opener-in-output", "required"])
def test_tool_grammar_accepts_the_official_rendering(rendered_calls, choice):
    out, opener = rendered_calls
    if choice == "auto":
        spec, ids = StructuredSpec.tool_call(TOOLS, "auto"), out
    elif choice == "required-opener-in-output":
        spec, ids = StructuredSpec.tool_call(TOOLS, opener_in_prompt=False), out
    else:
        spec, ids = StructuredSpec.tool_call(TOOLS), out[opener:]
    assert DSML_ID in ids
    assert _accepts(spec, ids)


def test_tool_grammar_rejects_other_tools_and_plain_text_dsml(rendered_calls):
    out, opener = rendered_calls
    assert not _accepts(StructuredSpec.tool_call(TOOLS, "noargs"), out[opener:])
    plain = load_tokenizer().decode(out[opener:], skip_special_tokens=False)
    assert DSML_ID not in _text_ids(plain)
    assert not _accepts(StructuredSpec.tool_call(TOOLS), _text_ids(plain))  # ｜DSML｜ as ordinary text


def test_tool_auto_allows_plain_content_then_eos():
    spec = StructuredSpec.tool_call(TOOLS, "auto")
    assert _accepts(spec, _ids("It is sunny.\n\nAnything else?"))
    assert _accepts(spec, [])


def test_bounded_string_parameter_is_cut_off():
    tool = {
        "name": "f",
        "parameters": {
            "type": "object",
            "properties": {"s": {"type": "string", "maxLength": 3}},
            "required": ["s"],
        },
    }
    c = default_compiler().constraint(StructuredSpec.tool_call([tool]))
    head = [
        *_ids("<"),
        DSML_ID,
        *_ids('invoke name="f">\n<'),
        DSML_ID,
        *_ids('parameter name="s" string="true">'),
    ]
    assert all(c.accept(t) for t in head + _ids("abc"))
    nxt = allowed(c).tolist()
    assert nxt and all("</".startswith(load_tokenizer().decode([t])) for t in nxt)  # "<" or "</" only
    assert c.accept(_ids("</")[0]) and allowed(c).tolist() == [DSML_ID]


def _function(name):
    return {
        "type": "function",
        "function": {
            "name": name,
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {"x": {"type": "string"}},
                "required": ["x"],
                "additionalProperties": False,
            },
        },
    }


@pytest.mark.parametrize(
    ("extra", "kind", "names"),
    [
        ({"tools": [_function("a"), _function("b")], "tool_choice": "required"}, "tool_call", ["a", "b"]),
        (
            {
                "tools": [_function("a"), _function("b")],
                "tool_choice": {"type": "function", "function": {"name": "b"}},
            },
            "tool_call",
            ["b"],
        ),
        ({"tools": [_function("a")]}, "tool_call", ["a"]),
        ({"response_format": {"type": "json_object"}}, "json_object", []),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "s",
                        "strict": True,
                        "schema": {
                            "type": "object",
                            "properties": {"n": {"type": "integer"}},
                            "required": ["n"],
                        },
                    },
                }
            },
            "json_schema",
            [],
        ),
    ],
)
def test_spec_from_deepseek_recipe_output_constraint(extra, kind, names):
    body = {
        "model": "DeepSeek-V4-Pro",
        "messages": [{"role": "user", "content": "json please"}],
        "thinking": {"type": "disabled"},
        **extra,
    }
    oc = dr.ChatCompletionRequest(body).convert(dr.ConversionOptions()).inference_options.output_constraint
    spec = StructuredSpec.from_output_constraint(oc.kind, oc.schema)
    default_compiler().check(spec)
    assert spec.kind == kind and [t.name for t in spec.chosen_tools()] == names
    if names:
        assert spec.tool_choice == ("auto" if "tool_choice" not in extra else "required")
