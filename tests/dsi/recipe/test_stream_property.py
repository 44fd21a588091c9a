"""Streaming property: for any chunking of a model output, the three protocols' streams read
back to exactly the non-streamed body, and well-formed outputs read back to what was written."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsi.recipe.bench_parse import DSML_ID, END_THINK_ID, THINK_ID, byte_ids, output_ids, tool_calls_block
from dsi.recipe.emit_common import OutputOptions
from dsi.recipe.emit_stream import OutputStream, collect
from dsi.tokenizer import EOS_ID


@dataclass
class Result:
    """A response reduced to what every protocol carries."""

    reasoning: str = ""
    content: str = ""
    calls: list[list[str]] = field(default_factory=list)  # [name, arguments JSON text]
    finish: str = ""

    def call_args(self) -> list[tuple[str, Any]]:
        return [(name, json.loads(args)) for name, args in self.calls]


def sse(piece: str) -> tuple[str | None, str]:
    assert piece.endswith("\n\n") and piece.count("\n\n") == 1, piece
    name, data = None, None
    for line in piece[:-2].split("\n"):
        key, _, value = line.partition(": ")
        if key == "event":
            name = value
        else:
            assert key == "data", line
            data = value
    assert data is not None
    return name, data


# -- readers: stream pieces (one list per step) -> Result, checking the protocol's rules ----------


def read_chat(steps: list[list[str]]) -> Result:
    out, role_seen, done, usage_seen = Result(), False, False, False
    for step in steps:
        kinds: list[tuple] = []
        for piece in step:
            name, data = sse(piece)
            assert name is None and not done
            if data == "[DONE]":
                done = True
                continue
            chunk = json.loads(data)
            assert chunk["object"] == "chat.completion.chunk"
            assert "usage" in chunk and (chunk["usage"] is None) == bool(chunk["choices"])
            if not chunk["choices"]:
                usage_seen = True
                assert out.finish, "usage chunk after the finish chunk"
                continue
            choice = chunk["choices"][0]
            delta = choice["delta"]
            assert ("role" in delta) == (not role_seen)
            role_seen = True
            if choice["finish_reason"]:
                out.finish = choice["finish_reason"]
            if "reasoning_content" in delta:
                out.reasoning += delta["reasoning_content"]
                kinds.append(("reasoning",))
            if delta.get("content"):
                out.content += delta["content"]
                kinds.append(("content",))
            for tc in delta.get("tool_calls", []):
                if "id" in tc:
                    assert tc["index"] == len(out.calls) and tc["function"]["arguments"] == ""
                    assert tc["type"] == "function" and tc["id"].startswith("call_")
                    out.calls.append([tc["function"]["name"], ""])
                else:
                    assert set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}
                    out.calls[tc["index"]][1] += tc["function"]["arguments"]
                    kinds.append(("args", tc["index"]))
        assert len(kinds) == len(set(kinds)), f"more than one delta of a kind in a step: {kinds}"
    assert done and usage_seen
    return out


def chat_body(body: dict) -> Result:
    choice = body["choices"][0]
    msg = choice["message"]
    calls = [[c["function"]["name"], c["function"]["arguments"]] for c in msg.get("tool_calls", [])]
    return Result(msg.get("reasoning_content") or "", msg["content"] or "", calls, choice["finish_reason"])


def read_responses(steps: list[list[str]]) -> Result:
    out, seq, items, texts = Result(), 0, {}, {}
    terminal = None
    for step in steps:
        kinds = []
        for piece in step:
            name, data = sse(piece)
            event = json.loads(data)
            assert event["type"] == name and terminal is None
            assert event["sequence_number"] == seq
            seq += 1
            if name == "response.output_item.added":
                assert event["output_index"] == len(texts)
                items[event["output_index"]] = event["item"]
                texts[event["output_index"]] = ""
                if event["item"]["type"] == "function_call":
                    out.calls.append([event["item"]["name"], ""])
            elif name.endswith(".delta"):
                i = event["output_index"]
                assert items[i]["id"] == event["item_id"]
                texts[i] += event["delta"]
                kinds.append((name, i))
                if name == "response.reasoning_text.delta":
                    out.reasoning += event["delta"]
                elif name == "response.output_text.delta":
                    out.content += event["delta"]
                else:
                    out.calls[-1][1] += event["delta"]
            elif name in ("response.reasoning_text.done", "response.output_text.done"):
                assert event["text"] == texts[event["output_index"]]
            elif name == "response.function_call_arguments.done":
                assert event["arguments"] == texts[event["output_index"]]
            elif name == "response.output_item.done":
                assert items.pop(event["output_index"])["id"] == event["item"]["id"]
            elif name in ("response.completed", "response.incomplete", "response.failed"):
                terminal = event["response"]
        assert len(kinds) == len(set(kinds))
    assert terminal is not None and not items, "every item is done before the response ends"
    out.finish = terminal["status"]
    return out


def responses_body(body: dict) -> Result:
    out = Result(finish=body["status"])
    for item in body["output"]:
        if item["type"] == "reasoning":
            out.reasoning += item["content"][0]["text"]
        elif item["type"] == "message":
            out.content += item["content"][0]["text"]
        else:
            out.calls.append([item["name"], item["arguments"]])
    return out


def read_messages(steps: list[list[str]]) -> Result:
    out, blocks, open_index, stopped = Result(), [], None, False
    for step in steps:
        kinds = []
        for piece in step:
            name, data = sse(piece)
            event = json.loads(data)
            assert event["type"] == name and not stopped
            if name == "content_block_start":
                assert open_index is None and event["index"] == len(blocks)
                open_index = event["index"]
                blocks.append(event["content_block"])
                if event["content_block"]["type"] == "tool_use":
                    assert event["content_block"]["id"].startswith("toolu_")
                    out.calls.append([event["content_block"]["name"], ""])
            elif name == "content_block_delta":
                assert event["index"] == open_index
                delta = event["delta"]
                kinds.append((delta["type"], open_index))
                if delta["type"] == "thinking_delta":
                    out.reasoning += delta["thinking"]
                elif delta["type"] == "text_delta":
                    out.content += delta["text"]
                elif delta["type"] == "input_json_delta":
                    out.calls[-1][1] += delta["partial_json"]
                else:
                    assert delta["type"] == "signature_delta" and delta["signature"]
            elif name == "content_block_stop":
                assert event["index"] == open_index
                open_index = None
            elif name == "message_delta":
                assert open_index is None
                out.finish = event["delta"]["stop_reason"]
            elif name == "message_stop":
                stopped = True
        assert len(kinds) == len(set(kinds))
    assert stopped
    return out


def messages_body(body: dict) -> Result:
    out = Result(finish=body["stop_reason"])
    for block in body["content"]:
        if block["type"] == "thinking":
            out.reasoning += block["thinking"]
        elif block["type"] == "text":
            out.content += block["text"]
        else:
            out.calls.append([block["name"], json.dumps(block["input"])])
    return out


READERS = {"chat": (read_chat, chat_body), "responses": (read_responses, responses_body)}
READERS["messages"] = (read_messages, messages_body)


def stream(options: OutputOptions, ids: list[int], cuts: list[int], reason: str) -> list[list[str]]:
    out = OutputStream(options)
    steps, start = [], 0
    for cut in [*sorted(set(cuts)), len(ids)]:
        if cut > start:
            steps.append(out.feed(ids[start:cut]))
            start = cut
    steps.append(out.finish(reason))
    return steps


def options_for(protocol: str, thinking: bool, stop=()) -> OutputOptions:
    return OutputOptions(
        protocol=protocol, model="DeepSeek-V4-Pro", request_id="req-prop", created=1700000000,
        thinking=thinking, tool_names=("f", "get_weather"), stop=tuple(stop), include_usage=True,
        prompt_tokens=20, cached_tokens=5,
    )  # fmt: skip


def check_all_protocols(ids, cuts, reason, thinking, stop=()) -> dict[str, Result]:
    """Stream vs non-stream in each protocol; returns the streamed results."""
    results = {}
    for protocol, (read, from_body) in READERS.items():
        options = options_for(protocol, thinking, stop)
        streamed = read(stream(options, ids, cuts, reason))
        body = from_body(collect(options, [ids], reason))
        if protocol == "messages":  # the body carries the parsed object, the stream its text
            assert [[n, json.loads(a)] for n, a in streamed.calls] == [
                [n, json.loads(a)] for n, a in body.calls
            ]
            streamed.calls = body.calls
        assert streamed == body, protocol
        results[protocol] = streamed
    return results


# -- strategies -------------------------------------------------------------------------------

PIECES = [
    "a", "Hello", " world", " ", "\n", "\n\n", ".", "😀", "🌦️", "👩‍💻", "中文", "天气", "é", "<", ">", "</",
    '"', "'", "\\", "{", "}", "｜DSML｜", "</think>", "<think>", "<｜end▁of▁sentence｜>", "parameter>",
    '<｜DSML｜invoke name="x">', "</｜DSML｜parameter>", "\t", "1.5",
]  # fmt: skip
texts = st.lists(st.sampled_from(PIECES), max_size=10).map("".join)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["k", "v", "é"]), inner, max_size=3)
    ),
    max_leaves=6,
)
params = st.dictionaries(st.sampled_from(["city", "q", "n", "data", "x_1"]), texts | json_values, max_size=3)
calls = st.lists(st.tuples(st.sampled_from(["f", "get_weather"]), params), max_size=3)


@st.composite
def model_outputs(draw):
    thinking = draw(st.booleans())
    reasoning, content, tool_calls = draw(texts), draw(texts), draw(calls)
    version = draw(st.sampled_from(["V4", "V4.1"]))
    parts: list = [reasoning, END_THINK_ID] if thinking else []
    parts.append(content)
    if tool_calls:
        parts += ["\n\n", *tool_calls_block(tool_calls, version)]
    ending = draw(st.sampled_from(["eos", "eos", "engine_stop", "length"]))
    if ending == "eos":
        parts.append(EOS_ID)
    ids: list[int] = []
    for part in parts:  # text by BPE or one byte per id, so characters split across ids
        spell_bytes = isinstance(part, str) and draw(st.booleans())
        ids += byte_ids(part) if spell_bytes else output_ids([part])
    if ending == "length":
        ids = ids[: draw(st.integers(0, len(ids)))]
    cuts = draw(st.lists(st.integers(0, max(len(ids), 1)), max_size=12))
    return dict(
        thinking=thinking,
        reasoning=reasoning,
        content=content,
        calls=tool_calls,
        ending=ending,
        ids=ids,
        cuts=cuts,
    )


SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(model_outputs())
def test_stream_equals_body_and_what_the_model_wrote(out):
    reason = "length" if out["ending"] == "length" else "stop"
    results = check_all_protocols(out["ids"], out["cuts"], reason, out["thinking"])
    chat = results["chat"]
    if out["ending"] == "length":
        assert chat.finish in ("length", "tool_calls")
        assert all(isinstance(args, dict) for _, args in chat.call_args())
        assert results["messages"].finish == {"length": "max_tokens", "tool_calls": "tool_use"}[chat.finish]
        assert results["responses"].finish == {"length": "incomplete", "tool_calls": "completed"}[chat.finish]
        return
    if out["thinking"]:
        assert chat.reasoning == out["reasoning"].strip("\n")
    content = out["content"].lstrip("\n")
    if out["calls"]:
        content = content.rstrip("\n")
    assert chat.content == content
    assert chat.call_args() == [(name, args) for name, args in out["calls"]]
    assert chat.finish == ("tool_calls" if out["calls"] else "stop")
    assert results["messages"].finish == ("tool_use" if out["calls"] else "end_turn")
    assert results["responses"].finish == "completed"


@SETTINGS
@given(
    texts,
    st.lists(st.sampled_from(["STOP", "\n\n", "</", "😀x", "ab"]), min_size=1, max_size=2),
    st.data(),
)
def test_stop_strings_in_any_chunking(text, stop, data):
    ids = output_ids(["think STOP", END_THINK_ID]) + byte_ids(text)
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=10))
    results = check_all_protocols(ids, cuts, "stop", thinking=True, stop=stop)
    content = text.lstrip("\n")  # leading newlines are not content, so no stop string sees them
    hits = [(content.find(s) + len(s), content.find(s), s) for s in stop if s in content]
    chat = results["chat"]
    assert chat.reasoning == "think STOP"
    if hits:
        _, start, _ = min(hits)
        assert chat.content == content[:start]
        assert results["messages"].finish == "stop_sequence"
    else:
        assert chat.content == content
        assert results["messages"].finish == "end_turn"
    assert chat.finish == "stop"


MARKER_IDS = sorted(
    {DSML_ID, END_THINK_ID, THINK_ID, EOS_ID}
    | set(
        output_ids(
            ["<", "</", "\n\n", "STOP", "tool_calls>", 'invoke name="f">', "parameter>", ' string="true">']
        )
    )
)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.integers(0, 129279) | st.sampled_from(MARKER_IDS), max_size=40),
    st.lists(st.integers(0, 40), max_size=8),
    st.booleans(),
    st.sampled_from(["stop", "length"]),
)
def test_random_ids_never_break_a_stream(ids, cuts, thinking, reason):
    # Any id sequence, markers and control tokens included, gives well-formed streams that read
    # back to the body, with stop strings and the tool-call parser both active.
    check_all_protocols(ids, cuts, reason, thinking, stop=("STOP",))
