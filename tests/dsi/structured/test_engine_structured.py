"""Structured output through the engine with the tiny model. Random weights produce gibberish,
so whatever is valid in the output is the constraint's doing."""

import json
import re

import pytest

from dsi.engine.engine import Engine, EngineConfig
from dsi.engine.params import SamplingParams
from dsi.errors import InvalidRequest
from dsi.structured import GrammarCompiler, StructuredSpec, default_compiler
from dsi.structured.vocab import DSML_ID
from dsi.tokenizer import encode_text, load_tokenizer
from tests.dsi.structured.helpers import parse_tool_calls, validate

SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "colour": {"enum": ["red", "green", "blue"]},
        "tag": {"type": "string", "maxLength": 6},
        "scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 3},
    },
    "required": ["ok", "n", "colour", "tag", "scores"],
    "additionalProperties": False,
}
WEATHER = {
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 12},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
        },
        "required": ["city", "days"],
        "additionalProperties": False,
    },
}
CLOCK = {
    "name": "set_alarm",
    "parameters": {
        "type": "object",
        "properties": {
            "hour": {"type": "integer", "minimum": 0, "maximum": 23},
            "label": {"enum": ["work", "gym"]},
        },
        "required": ["hour", "label"],
    },
}
REGEX = r"[a-z]{3,8}-[0-9]{2}"
GREEDY = {"temperature": 0}
SAMPLED = {"temperature": 1.0, "top_p": 0.95, "seed": 11}
MODES = [GREEDY, SAMPLED]
IDS = ["greedy", "sampled"]


@pytest.fixture(scope="module")
def engine(tiny):
    cfg, w = tiny
    eng = Engine(cfg, w, EngineConfig(num_blocks=64, num_slots=8, max_running=8))
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def prompts():
    return [encode_text(text) for text in ("Answer in JSON.", "What is the weather in Paris?", "Hi")]


def _run_all(engine, prompts, max_tokens=64, **kw):
    """One batch: every prompt with the same params; outputs in prompt order."""
    names = [f"r{len(engine.timings)}-{i}" for i in range(len(prompts))]
    for name, prompt in zip(names, prompts, strict=True):
        engine.add_request(name, prompt, SamplingParams(max_tokens=max_tokens, **kw))
    done = {o.request_id: o for o in engine.run_until_done() if o.finished}
    return [done[name] for name in names]


def _run(engine, prompt, max_tokens=64, **kw):
    return _run_all(engine, [prompt], max_tokens, **kw)[0]


def _text(ids):
    return load_tokenizer().decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_json_schema_output_validates(engine, prompts, mode):
    for out in _run_all(engine, prompts, structured=StructuredSpec.json_schema(SCHEMA), **mode):
        assert out.finish_reason == "stop", _text(out.output)
        validate(json.loads(_text(out.output)), SCHEMA)


def test_json_object_output_parses(engine, prompts):
    """Free JSON lets random weights write endless strings: an output cut by max_tokens must
    still be a prefix the grammar accepts; one that stopped must parse as an object."""
    spec = StructuredSpec.json_object()
    outs = [
        out for mode in MODES for out in _run_all(engine, prompts, max_tokens=24, structured=spec, **mode)
    ]
    for out in outs:
        if out.finish_reason == "stop":
            assert isinstance(json.loads(_text(out.output)), dict)
        else:
            assert out.finish_reason == "length" and _text(out.output).startswith("{")
            default_compiler().replay(spec, out.output)
    assert any(out.finish_reason == "stop" for out in outs)


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_regex_output_matches_in_full(engine, prompts, mode):
    for out in _run_all(engine, prompts, structured=StructuredSpec.for_regex(REGEX), **mode):
        assert out.finish_reason == "stop" and re.fullmatch(REGEX, _text(out.output)), _text(out.output)


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_required_tool_call_is_a_valid_dsml_block(engine, prompts, mode):
    spec = StructuredSpec.tool_call([WEATHER, CLOCK], parallel=False)
    for out in _run_all(engine, prompts, max_tokens=64, structured=spec, **mode):
        assert out.finish_reason == "stop", _text(out.output)
        text = _text(out.output)
        assert out.output.count(DSML_ID) == text.count("｜DSML｜")  # every marker is the control token
        [(name, args)] = parse_tool_calls(text)
        validate(args, {"get_weather": WEATHER, "set_alarm": CLOCK}[name]["parameters"])


def test_named_tool_choice_calls_that_tool(engine, prompts):
    spec = StructuredSpec.tool_call([WEATHER, CLOCK], "set_alarm", opener_in_prompt=False)
    out = _run(engine, prompts[1], max_tokens=64, structured=spec, **SAMPLED)
    calls = parse_tool_calls(_text(out.output), opener=True)
    assert [name for name, _ in calls] == ["set_alarm"] * len(calls)
    for _, args in calls:
        validate(args, CLOCK["parameters"])


def test_max_tokens_before_done_is_length(engine, prompts):
    out = _run(engine, prompts[0], max_tokens=4, structured=StructuredSpec.json_schema(SCHEMA), **GREEDY)
    assert out.finish_reason == "length" and len(out.output) == 4
    assert _text(out.output).startswith('{"ok": ')


def test_reasoning_before_think_end_is_unconstrained(engine, prompts):
    free = _run(engine, prompts[0], max_tokens=6, **GREEDY)
    thinking = _run(
        engine, prompts[0], max_tokens=6, structured=StructuredSpec.json_object(after_think=True), **GREEDY
    )
    assert thinking.output == free.output and not _text(free.output).startswith("{")


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        (StructuredSpec.for_regex("(unclosed"), "regex: cannot compile"),
        (StructuredSpec("json_schema", schema="{"), "not valid JSON"),
        (StructuredSpec.tool_call([WEATHER], "missing"), "not among the tools"),
        ("json_object", "StructuredSpec"),
    ],
)
def test_bad_spec_is_invalid_request_and_engine_keeps_serving(engine, prompts, spec, match):
    with pytest.raises(InvalidRequest, match=match):
        engine.add_request("bad", prompts[0], SamplingParams(structured=spec))
    assert "bad" not in engine.requests
    out = _run(engine, prompts[0], max_tokens=3, **GREEDY)
    assert len(out.output) == 3


def test_async_and_sync_give_identical_outputs(tiny, prompts):
    cfg, w = tiny
    results = []
    for async_on in (True, False):
        eng = Engine(cfg, w, EngineConfig(num_blocks=32, async_scheduling=async_on))
        for i, prompt in enumerate(prompts):
            eng.add_request(
                str(i),
                prompt,
                SamplingParams(max_tokens=32, structured=StructuredSpec.json_schema(SCHEMA), **SAMPLED),
            )
        results.append({o.request_id: o.output for o in eng.run_until_done() if o.finished})
        eng.close()
    assert results[0] == results[1]


def test_preempted_requests_rebuild_their_constraint(tiny, monkeypatch):
    """Three 120-token prompts on 3 pages: crossing 128 tokens needs a page another request holds."""
    cfg, w = tiny
    prompts = [encode_text(f"Request {i}: " + "word " * 117)[:120] for i in range(3)]
    spec = StructuredSpec.json_schema(SCHEMA)
    replays = []
    replay = GrammarCompiler.replay
    monkeypatch.setattr(
        GrammarCompiler,
        "replay",
        lambda self, s, tokens: replays.append(list(tokens)) or replay(self, s, tokens),
    )

    def run(config):
        eng = Engine(cfg, w, config)
        for i, p in enumerate(prompts):
            eng.add_request(str(i), p, SamplingParams(max_tokens=48, structured=spec, **SAMPLED))
        outs = {o.request_id: o for o in eng.run_until_done() if o.finished}
        eng.close()
        return outs, eng.scheduler.preemptions

    roomy, _ = run(EngineConfig(num_blocks=16))
    tight, preemptions = run(EngineConfig(num_blocks=4, max_batch_tokens=512))
    assert preemptions > 0 and any(replays)
    for rid, out in tight.items():
        assert (out.output, out.finish_reason) == (roomy[rid].output, roomy[rid].finish_reason)
    for out in tight.values():
        if out.finish_reason == "stop":
            validate(json.loads(_text(out.output)), SCHEMA)
    assert any(out.finish_reason == "stop" for out in tight.values())


@pytest.mark.parametrize("steps", [0, 5], ids=["after-prefill", "mid-decode"])
def test_export_import_replays_the_output(tiny, prompts, steps):
    cfg, w = tiny
    params = SamplingParams(max_tokens=32, structured=StructuredSpec.json_schema(SCHEMA), **SAMPLED)
    single = Engine(cfg, w)
    single.add_request("r", prompts[1], params)
    expected = next(o for o in single.run_until_done() if o.finished).output
    single.close()

    source = Engine(cfg, w)
    source.add_request("r", prompts[1], params, prefill_only=steps == 0)
    for _ in range(max(steps, 1)):
        source.step()
    source.run_until_done() if steps == 0 else None
    state = source.export_request("r")
    source.close()
    assert 0 < len(state.output) < len(expected)
    target = Engine(cfg, w, EngineConfig(async_scheduling=False))
    target.import_request(state)
    out = next(o for o in target.run_until_done() if o.finished)
    target.close()
    assert out.output == expected
    if out.finish_reason == "stop":  # 32 sampled tokens may end before the document does
        validate(json.loads(_text(out.output)), SCHEMA)


def test_import_of_output_outside_the_grammar_is_rejected(tiny, prompts):
    cfg, w = tiny
    source = Engine(cfg, w)
    source.add_request("r", prompts[0], SamplingParams(max_tokens=8, temperature=0), prefill_only=True)
    source.run_until_done()
    state = source.export_request("r")
    source.close()
    state.params = SamplingParams(max_tokens=8, temperature=0, structured=StructuredSpec.for_regex("[0-9]+"))
    target = Engine(cfg, w)
    with pytest.raises(InvalidRequest, match="does not fit"):
        target.import_request(state)
    target.close()
