"""Protocol emitters: event shapes and orders of Chat Completions, Responses and Messages."""

from __future__ import annotations

import json

import pytest

from dsi.recipe.bench_parse import DSML_ID, END_THINK_ID, output_ids, tool_calls_block
from dsi.recipe.emit_common import OutputOptions, Usage, derived_id
from dsi.recipe.emit_stream import OutputStream, collect
from dsi.tokenizer import EOS_ID

CALL = [("get_weather", {"city": "Paris", "days": 3})]
FULL = output_ids(["Thinking.", END_THINK_ID, "Sure.\n\n", *tool_calls_block(CALL), EOS_ID])
CUT = output_ids(
    ["r", END_THINK_ID, "<", DSML_ID, "tool_calls>\n<", DSML_ID, 'invoke name="get_weather">\n<']
)
CUT += output_ids([DSML_ID, 'parameter name="city" string="true">Par'])


def opts(protocol: str, **kw) -> OutputOptions:
    base = dict(
        protocol=protocol, model="DeepSeek-V4-Pro", request_id=f"id-{protocol}", created=1700000000,
        tool_names=("get_weather",), prompt_tokens=12, cached_tokens=4,
    )  # fmt: skip
    return OutputOptions(**{**base, **kw})


def run(
    options: OutputOptions, ids: list[int], reason: str = "stop", step: int = 1
) -> tuple[list[list[str]], OutputStream]:
    out = OutputStream(options)
    steps = [out.feed(ids[i : i + step]) for i in range(0, len(ids), step)]
    steps.append(out.finish(reason))
    return steps, out


def events(steps: list[list[str]]) -> list[tuple[str | None, object]]:
    parsed = []
    for piece in (p for s in steps for p in s):
        name = None
        for line in piece.strip("\n").split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            else:
                data = line[6:]
        parsed.append((name, data if data == "[DONE]" else json.loads(data)))
    return parsed


# -- options ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"protocol": "completions"}, "protocol"),
        ({"model_version": "V5"}, "model_version"),
        ({"request_id": ""}, "request_id"),
        ({"stop": ("ok", "")}, "stop"),
        ({"cached_tokens": 13}, "cached_tokens"),
    ],
)
def test_options_reject_bad_values_naming_the_field(bad, field):
    with pytest.raises(ValueError, match=field):
        opts(bad.pop("protocol", "chat"), **bad)


def test_options_default_start_follows_thinking():
    assert opts("chat").in_reasoning_at_start is True
    assert opts("chat", thinking=False).in_reasoning_at_start is False
    assert opts("chat", starts_in_reasoning=False).in_reasoning_at_start is False


def test_derived_ids_are_stable_and_distinct():
    a = derived_id("call_", "req", 0)
    assert a == derived_id("call_", "req", 0) and a.startswith("call_") and len(a) == 29
    assert len({a, derived_id("call_", "req", 1), derived_id("call_", "req2", 0)}) == 3


# -- Chat Completions ---------------------------------------------------------------------------


def test_chat_stream_with_usage():
    steps, out = run(opts("chat", include_usage=True), FULL)
    evs = [d for _, d in events(steps)]
    assert evs[-1] == "[DONE]"
    chunks = evs[:-1]
    assert all("usage" in c for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:-1])
    usage_chunk, finish_chunk = chunks[-1], chunks[-2]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == len(FULL)
    assert usage_chunk["usage"]["prompt_tokens_details"] == {"cached_tokens": 4}
    assert all(c["usage"] is None for c in chunks[:-1])
    assert finish_chunk["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "tool_calls",
    }
    calls = [tc for c in chunks[:-1] for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    first = calls[0]
    assert first == {
        "index": 0,
        "id": first["id"],
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    assert first["id"].startswith("call_")
    assert json.loads("".join(tc["function"]["arguments"] for tc in calls[1:])) == {
        "city": "Paris",
        "days": 3,
    }
    assert out.usage().reasoning_tokens > 0


def test_chat_without_usage_has_no_usage_key_and_role_comes_first_even_before_text():
    out = OutputStream(opts("chat", tool_names=()))
    first = out.feed(output_ids(["\n"]))  # nothing to release yet: the role chunk still goes out
    assert len(first) == 1
    chunk = json.loads(first[0][6:])
    assert "usage" not in chunk and chunk["choices"][0]["delta"] == {"role": "assistant", "content": ""}


def test_one_chunk_per_kind_per_step():
    steps, _ = run(opts("chat"), FULL, step=len(FULL))
    chunks = [d for _, d in events(steps[:1]) if d != "[DONE]"]
    kinds = [tuple(sorted(set(c["choices"][0]["delta"]) - {"role"})) for c in chunks]
    assert kinds == [("reasoning_content",), ("content",), ("tool_calls",), ("tool_calls",), ()]


@pytest.mark.parametrize(
    "ids, reason, stop, expected",
    [
        (output_ids(["r", END_THINK_ID, "hi", EOS_ID]), "stop", (), "stop"),
        (output_ids(["r", END_THINK_ID, "hi there"]), "length", (), "length"),
        (output_ids(["r", END_THINK_ID, "hi END there"]), "length", ("END",), "stop"),
        (FULL, "stop", (), "tool_calls"),
        (CUT, "length", (), "length"),
    ],
)
def test_chat_finish_reasons(ids, reason, stop, expected):
    options = opts("chat", stop=stop)
    steps, _ = run(options, ids, reason)
    assert events(steps)[-2][1]["choices"][0]["finish_reason"] == expected
    assert collect(options, [ids], reason)["choices"][0]["finish_reason"] == expected


def test_chat_body():
    body = collect(opts("chat"), [FULL], "stop")
    msg = body["choices"][0]["message"]
    assert body["object"] == "chat.completion"
    assert msg["content"] == "Sure." and msg["reasoning_content"] == "Thinking."
    assert msg["tool_calls"][0]["function"]["name"] == "get_weather"
    assert body["usage"]["total_tokens"] == 12 + len(FULL)


def test_chat_length_mid_tool_call_closes_arguments():
    body = collect(opts("chat"), [CUT], "length")
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length"
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"city": "Par"}


def test_chat_error_ends_with_an_error_object():
    steps, out = run(opts("chat"), output_ids(["r", END_THINK_ID, "partial"]), "error")
    last = events(steps)[-1][1]
    assert last["error"]["type"] == "server_error" and "[DONE]" not in "".join(steps[-1])
    assert out.http_status == 500 and "error" in out.body()


def test_usage_override():
    options = opts("chat", include_usage=True)
    out = OutputStream(options)
    out.feed(output_ids(["a"]))
    pieces = out.finish("length", Usage(12, 99, 4, 7))
    usage = json.loads(pieces[-2][6:])["usage"]
    assert usage["completion_tokens"] == 99 and usage["completion_tokens_details"] == {"reasoning_tokens": 7}


def test_nothing_after_done():
    out = OutputStream(opts("chat"))
    assert out.feed(output_ids(["r", END_THINK_ID, "ok", EOS_ID]))[-1] == "data: [DONE]\n\n"
    assert out.done
    assert out.feed(output_ids(["more"])) == [] and out.finish("length") == []


def test_body_before_the_end_is_an_error():
    for protocol in ("chat", "responses", "messages"):
        out = OutputStream(opts(protocol))
        out.feed(output_ids(["a"]))
        with pytest.raises(RuntimeError):
            out.body()


# -- Responses ------------------------------------------------------------------------------------


def test_responses_event_order():
    steps, _ = run(opts("responses", response_fields={"instructions": "be brief"}), FULL, step=3)
    evs = events(steps)
    names = [n for n, _ in evs]
    assert all(d != "[DONE]" for _, d in evs)
    assert [d["sequence_number"] for _, d in evs] == list(range(len(evs)))
    assert names[:2] == ["response.created", "response.in_progress"]
    assert evs[0][1]["response"]["instructions"] == "be brief"
    collapsed = [n for i, n in enumerate(names) if i == 0 or n != names[i - 1]]
    assert collapsed == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed",
    ]  # fmt: skip
    final = evs[-1][1]["response"]
    assert final["status"] == "completed"
    assert [o["type"] for o in final["output"]] == ["reasoning", "message", "function_call"]
    fc = final["output"][2]
    assert fc["id"].startswith("fc_") and fc["call_id"].startswith("call_") and fc["status"] == "completed"
    assert final["usage"]["input_tokens_details"] == {"cached_tokens": 4}


def test_responses_length_mid_tool_call_is_incomplete():
    steps, _ = run(opts("responses"), CUT, "length")
    evs = events(steps)
    assert evs[-1][0] == "response.incomplete"
    response = evs[-1][1]["response"]
    assert response["status"] == "incomplete" and response["incomplete_details"] == {
        "reason": "max_output_tokens"
    }
    fc = response["output"][-1]
    assert fc["status"] == "incomplete" and json.loads(fc["arguments"]) == {"city": "Par"}
    assert collect(opts("responses"), [CUT], "length") == response


def test_responses_length_mid_text_marks_the_message_incomplete():
    body = collect(opts("responses"), [output_ids(["r", END_THINK_ID, "partial answer"])], "length")
    assert body["status"] == "incomplete" and body["output"][-1]["status"] == "incomplete"
    assert body["output"][-1]["content"][0]["text"] == "partial answer"


def test_responses_failure():
    steps, out = run(opts("responses"), output_ids(["r", END_THINK_ID, "x"]), "abort")
    name, data = events(steps)[-1]
    assert name == "response.failed" and data["response"]["status"] == "failed"
    assert out.http_status == 503 and "error" in out.body()


# -- Messages -------------------------------------------------------------------------------------


def test_messages_event_order_and_blocks():
    steps, _ = run(opts("messages"), FULL, step=2)
    evs = events(steps)
    names = [n for n, _ in evs]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    start = evs[0][1]["message"]
    assert start["usage"] == {
        "input_tokens": 8,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 4,
        "output_tokens": 0,
    }
    blocks = [d["content_block"] for n, d in evs if n == "content_block_start"]
    assert [b["type"] for b in blocks] == ["thinking", "text", "tool_use"]
    assert [d["index"] for n, d in evs if n == "content_block_start"] == [0, 1, 2]
    assert blocks[2]["id"].startswith("toolu_") and blocks[2]["input"] == {}
    thinking_deltas = [d["delta"]["type"] for n, d in evs if n == "content_block_delta" and d["index"] == 0]
    assert thinking_deltas[-1] == "signature_delta" and set(thinking_deltas[:-1]) == {"thinking_delta"}
    assert evs[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert evs[-2][1]["usage"]["output_tokens"] == len(FULL)


def test_messages_body():
    body = collect(opts("messages"), [FULL], "stop")
    assert body["type"] == "message" and body["stop_reason"] == "tool_use"
    thinking, text, tool = body["content"]
    assert thinking["thinking"] == "Thinking." and thinking["signature"]
    assert text == {"type": "text", "text": "Sure."}
    assert tool["input"] == {"city": "Paris", "days": 3} and tool["id"].startswith("toolu_")


@pytest.mark.parametrize(
    "ids, reason, stop, expected, sequence",
    [
        (output_ids(["r", END_THINK_ID, "hi", EOS_ID]), "stop", (), "end_turn", None),
        (
            output_ids(["r", END_THINK_ID, "hi", "\n\nUser:"]),
            "stop",
            ("\n\nUser:",),
            "stop_sequence",
            "\n\nUser:",
        ),
        (output_ids(["r", END_THINK_ID, "hi"]), "length", (), "max_tokens", None),
        (CUT, "length", (), "max_tokens", None),
    ],
)
def test_messages_stop_reasons(ids, reason, stop, expected, sequence):
    body = collect(opts("messages", stop=stop), [ids], reason)
    assert (body["stop_reason"], body["stop_sequence"]) == (expected, sequence)


def test_messages_length_mid_tool_call_keeps_a_valid_input():
    body = collect(opts("messages"), [CUT], "length")
    assert body["content"][-1]["input"] == {"city": "Par"}


def test_messages_error_event():
    steps, out = run(opts("messages"), output_ids(["r"]), "error")
    name, data = events(steps)[-1]
    assert name == "error" and data == {
        "type": "error",
        "error": {"type": "api_error", "message": data["error"]["message"]},
    }
    assert out.body()["type"] == "error"


def test_messages_without_thinking_has_no_thinking_block():
    body = collect(opts("messages", thinking=False), [output_ids(["Hello", EOS_ID])], "stop")
    assert body["content"] == [{"type": "text", "text": "Hello"}]


def test_ignore_eos_runs_the_output_past_eos_to_the_engines_finish() -> None:
    """A request with ignore_eos: EOS neither ends the message nor shows in its text."""
    ids = output_ids(["Hello", EOS_ID, " again"])
    stopped = OutputStream(opts("chat", thinking=False))
    stopped.feed(ids)
    assert stopped.done and stopped.body()["choices"][0]["message"]["content"] == "Hello"
    out = OutputStream(opts("chat", thinking=False, ignore_eos=True))
    out.feed(ids)
    assert not out.done
    out.finish("length")
    choice = out.body()["choices"][0]
    assert choice["message"]["content"] == "Hello again" and choice["finish_reason"] == "length"
