"""Per-token logprobs in Chat Completions and Responses: which ids are listed (content ids only),
their shape (the openai SDK's types and accumulators read them), and the same list streamed in
any step size as in the body."""

from __future__ import annotations

import json

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import ResponseOutputText, ResponseTextDeltaEvent, ResponseTextDoneEvent

from dsi.recipe.bench_parse import DSML_ID, END_THINK_ID, byte_ids, output_ids, tool_calls_block
from dsi.recipe.detok import byte_table
from dsi.recipe.emit_common import OutputOptions
from dsi.recipe.emit_stream import OutputStream
from dsi.tokenizer import EOS_ID

ARGS = {"city": "Paris"}
FULL = output_ids(["Thinking.", END_THINK_ID, "Sure ", *byte_ids("😀"), "\n\n"])
FULL += output_ids([*tool_calls_block([("get_weather", ARGS)]), EOS_ID])
CONTENT = FULL[
    FULL.index(END_THINK_ID) + 1 : FULL.index(DSML_ID)
]  # "Sure ", the emoji's 4 bytes, "\n\n", "<"
TOP = 2


def logprob(i: int) -> float:
    return -0.01 - i / 8


def top(i: int, token: int) -> list[tuple[int, float]]:
    return [(token, logprob(i)), (token + 1, logprob(i) - 1.0)][:TOP]


def entry(i: int, token: int) -> dict:
    table = byte_table()

    def one(t: int, lp: float) -> dict:
        return {"token": table[t].decode("utf-8", "replace"), "logprob": lp, "bytes": list(table[t])}

    return {**one(token, logprob(i)), "top_logprobs": [one(t, lp) for t, lp in top(i, token)]}


def expected(ids: list[int], content: list[int]) -> list[dict]:
    """Entries of ``content`` ids, which ``ids`` hold as one contiguous run."""
    start = next(i for i in range(len(ids)) if ids[i : i + len(content)] == content)
    return [entry(start + k, t) for k, t in enumerate(content)]


def run(
    protocol: str,
    ids: list[int],
    step: int,
    *,
    thinking: bool = True,
    stop: tuple[str, ...] = (),
    logprobs: bool = True,
    reason: str = "stop",
) -> tuple[list[str], dict]:
    options = OutputOptions(protocol=protocol, model="dsi-tiny", request_id="req-lp", created=1700000000,
                            thinking=thinking, tool_names=("get_weather",), stop=stop, prompt_tokens=9,
                            logprobs=logprobs)  # fmt: skip
    out = OutputStream(options)
    pieces: list[str] = []
    for i in range(0, len(ids), step):
        chunk = ids[i : i + step]
        pieces += out.feed(chunk, [logprob(i + k) for k in range(len(chunk))],
                           [top(i + k, t) for k, t in enumerate(chunk)])  # fmt: skip
        if out.done:
            break
    pieces += out.finish(reason)
    return pieces, out.body()


def chat_chunks(pieces: list[str]) -> list[ChatCompletionChunk]:
    data = [p.removeprefix("data: ").strip() for p in pieces]
    return [ChatCompletionChunk.model_validate_json(d) for d in data if d != "[DONE]"]


def response_events(pieces: list[str]) -> list[dict]:
    return [json.loads(p.split("data: ", 1)[1]) for p in pieces]


@pytest.mark.parametrize("step", [1, 3, 100])
def test_chat_lists_content_ids_only_the_same_streamed_and_not(step):
    pieces, body = run("chat", FULL, step)
    want = expected(FULL, CONTENT)
    assert body["choices"][0]["logprobs"] == {"content": want, "refusal": None}
    completion = ChatCompletion.model_validate(body)
    assert b"".join(bytes(e.bytes) for e in completion.choices[0].logprobs.content) == "Sure 😀\n\n<".encode()
    chunks = chat_chunks(pieces)
    streamed = [
        e.model_dump() for c in chunks for ch in c.choices if ch.logprobs for e in ch.logprobs.content
    ]
    assert streamed == want
    # entries ride on content chunks (or the finish chunk), never on reasoning or tool-call chunks
    for c in chunks:
        for ch in c.choices:
            if ch.logprobs is not None:
                assert ch.delta.content is not None or ch.finish_reason is not None
                assert not ch.delta.tool_calls and not (ch.delta.model_extra or {}).get("reasoning_content")
    state = ChatCompletionStreamState()
    for c in chunks:
        state.handle_chunk(c)
    final = state.get_final_completion()
    assert [e.model_dump() for e in final.choices[0].logprobs.content] == want
    assert final.choices[0].message.content == "Sure 😀"


def test_chat_without_thinking_starts_with_content_and_stops_at_a_stop_string():
    ids = output_ids(["Hello world, and more.", EOS_ID])
    pieces, body = run("chat", ids, 1, thinking=False, stop=("world",))
    listed = body["choices"][0]["logprobs"]["content"]
    text = b"".join(bytes(e["bytes"]) for e in listed).decode()
    assert text.startswith("Hello world") and "more" not in text  # up to the id completing the stop string
    assert body["choices"][0]["message"]["content"] == "Hello "
    streamed = [e.model_dump() for c in chat_chunks(pieces) for ch in c.choices if ch.logprobs
                for e in ch.logprobs.content]  # fmt: skip
    assert streamed == listed


def test_chat_without_logprobs_reports_null():
    pieces, body = run("chat", FULL, 3, logprobs=False)
    assert body["choices"][0]["logprobs"] is None
    assert all(ch.logprobs is None for c in chat_chunks(pieces) for ch in c.choices)


def test_reasoning_only_output_lists_nothing():
    ids = output_ids(["Only thinking here"])
    pieces, body = run("chat", ids, 2, reason="length")
    assert body["choices"][0]["logprobs"] == {"content": [], "refusal": None}
    assert all(ch.logprobs is None for c in chat_chunks(pieces) for ch in c.choices)


def test_a_forbidden_id_in_top_logprobs_is_very_unlikely_not_minus_infinity():
    ids = output_ids(["Hi", EOS_ID])
    out = OutputStream(OutputOptions(protocol="chat", model="m", request_id="r", created=1, thinking=False,
                                     logprobs=True))  # fmt: skip
    out.feed(ids, [-0.5] * len(ids), [[(ids[0], -0.5), (7, float("-inf"))]] * len(ids))
    out.finish("stop")
    first = out.body()["choices"][0]["logprobs"]["content"][0]
    assert first["top_logprobs"][1]["logprob"] == -9999.0


@pytest.mark.parametrize("step", [1, 4, 100])
def test_responses_deltas_done_and_part_carry_the_content_logprobs(step):
    pieces, body = run("responses", FULL, step)
    want = expected(FULL, CONTENT)
    message = next(item for item in body["output"] if item["type"] == "message")
    part = ResponseOutputText.model_validate(message["content"][0])
    assert [e.model_dump() for e in part.logprobs] == want and part.text == "Sure 😀"
    events = response_events(pieces)
    deltas = [
        ResponseTextDeltaEvent.model_validate(e) for e in events if e["type"] == "response.output_text.delta"
    ]
    assert [lp.model_dump(exclude_none=True) | {"bytes": raw["bytes"]}
            for d, e in zip(deltas, [e for e in events if e["type"] == "response.output_text.delta"], strict=True)
            for lp, raw in zip(d.logprobs, e["logprobs"], strict=True)] == want  # fmt: skip
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert ResponseTextDoneEvent.model_validate(done).logprobs and done["logprobs"] == want
    completed = next(e for e in events if e["type"] == "response.completed")
    assert completed["response"] == body


def test_responses_without_logprobs_reports_empty_lists():
    pieces, body = run("responses", FULL, 3, logprobs=False)
    message = next(item for item in body["output"] if item["type"] == "message")
    assert message["content"][0]["logprobs"] == []
    assert all(
        e["logprobs"] == [] for e in response_events(pieces) if e["type"] == "response.output_text.delta"
    )


def test_messages_ignore_logprobs_events():
    pieces, body = run("messages", FULL, 3)
    assert "logprobs" not in json.dumps(body) and not any("logprobs" in p for p in pieces)
