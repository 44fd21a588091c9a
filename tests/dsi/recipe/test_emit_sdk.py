"""The official openai and anthropic SDKs parse our streams and bodies.

An aiohttp server on 127.0.0.1 answers each SDK request with the output of ``OutputStream``
for a scripted model output (one SSE write per engine step), so the SDKs' own SSE decoding,
typed events and accumulators run against our bytes, without any other network.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anthropic
import openai
import pytest
from aiohttp import web

from dsi.recipe.bench_parse import DSML_ID, END_THINK_ID, byte_ids, output_ids, tool_calls_block
from dsi.recipe.emit_common import OutputOptions
from dsi.recipe.emit_stream import OutputStream
from dsi.tokenizer import EOS_ID

ARGS = {"city": 'Par"is\n', "days": 3, "opts": {"units": ["C", 1.5]}}
FULL = output_ids(["Thinking 中文.", END_THINK_ID, "Sure ", *byte_ids("😀"), "\n\n"])
FULL += output_ids([*tool_calls_block([("get_weather", ARGS)]), EOS_ID])
CUT = output_ids(
    ["r", END_THINK_ID, "<", DSML_ID, "tool_calls>\n<", DSML_ID, 'invoke name="get_weather">\n<']
)
CUT += output_ids([DSML_ID, 'parameter name="city" string="true">Par'])
TEXT_ONLY = output_ids(["Hmm.", END_THINK_ID, "Hello ", *byte_ids("世界"), "!", EOS_ID])
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


@dataclass
class Script:
    """What the fake engine generates for the next request: ids, how it ends, ids per step."""

    ids: list[int]
    reason: str = "stop"
    step: int = 3


@dataclass
class FakeEngine:
    url: str
    script: Script


ENGINE = web.AppKey("engine", FakeEngine)


PROTOCOL_OF = {"/v1/chat/completions": "chat", "/v1/responses": "responses", "/v1/messages": "messages"}


async def answer(request: web.Request) -> web.StreamResponse:
    script = request.app[ENGINE].script
    body = await request.json()
    options = OutputOptions(
        protocol=PROTOCOL_OF[request.path], model=body["model"], request_id="req-sdk-1", created=1700000000,
        thinking=True, tool_names=("get_weather",), prompt_tokens=30, cached_tokens=10,
        include_usage=bool((body.get("stream_options") or {}).get("include_usage")),
    )  # fmt: skip
    out = OutputStream(options)
    if not body.get("stream"):
        for i in range(0, len(script.ids), script.step):
            out.feed(script.ids[i : i + script.step])
        out.finish(script.reason)
        return web.json_response(out.body(), status=out.http_status)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i in range(0, len(script.ids), script.step):
        for piece in out.feed(script.ids[i : i + script.step]):
            await resp.write(piece.encode())
    for piece in out.finish(script.reason):
        await resp.write(piece.encode())
    await resp.write_eof()
    return resp


@pytest.fixture
async def server() -> AsyncIterator[FakeEngine]:
    app = web.Application()
    for path in PROTOCOL_OF:
        app.router.add_post(path, answer)
    engine = app[ENGINE] = FakeEngine("", Script(FULL))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    engine.url = f"http://{host}:{port}"
    yield engine
    await runner.cleanup()


def oai(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0)


def anth(url: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0)


MESSAGES = [{"role": "user", "content": "weather?"}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "input_schema": {"type": "object"}}]


# -- Chat Completions ---------------------------------------------------------------------------


async def test_chat_stream_accumulator(server):
    async with oai(server.url).chat.completions.stream(
        model="DeepSeek-V4-Pro", messages=MESSAGES, tools=TOOLS, stream_options={"include_usage": True}
    ) as stream:
        final = await stream.get_final_completion()
    msg = final.choices[0].message
    assert msg.content == "Sure 😀"
    assert msg.model_extra["reasoning_content"] == "Thinking 中文."
    call = msg.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == ARGS
    assert final.choices[0].finish_reason == "tool_calls"
    assert final.usage.prompt_tokens == 30 and final.usage.completion_tokens == len(FULL)


async def test_chat_raw_stream_chunks(server):
    stream = await oai(server.url).chat.completions.create(
        model="DeepSeek-V4-Pro", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == 30 + len(FULL)
    assert all(c.usage is None for c in chunks[:-1])


async def test_chat_body(server):
    completion = await oai(server.url).chat.completions.create(
        model="DeepSeek-V4-Pro", messages=MESSAGES, tools=TOOLS
    )
    msg = completion.choices[0].message
    assert msg.content == "Sure 😀" and json.loads(msg.tool_calls[0].function.arguments) == ARGS
    assert completion.usage.prompt_tokens_details.cached_tokens == 10


async def test_chat_length_mid_tool_call(server):
    server.script = Script(CUT, "length")
    with pytest.raises(openai.LengthFinishReasonError) as cut:  # the SDK's way of reporting it
        async with oai(server.url).chat.completions.stream(
            model="DeepSeek-V4-Pro", messages=MESSAGES
        ) as stream:
            await stream.get_final_completion()
    final = cut.value.completion
    assert final.choices[0].finish_reason == "length"
    assert json.loads(final.choices[0].message.tool_calls[0].function.arguments) == {"city": "Par"}


async def test_chat_stream_error_raises(server):
    server.script = Script(TEXT_ONLY[:3], "error")
    stream = await oai(server.url).chat.completions.create(
        model="DeepSeek-V4-Pro", messages=MESSAGES, stream=True
    )
    with pytest.raises(openai.APIError, match="engine failed"):
        async for _ in stream:
            pass


# -- Responses ------------------------------------------------------------------------------------


async def test_responses_stream_final_response(server):
    async with oai(server.url).responses.stream(model="DeepSeek-V4-Pro", input="weather?") as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    reasoning, _, call = final.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == "Thinking 中文."
    assert final.output_text == "Sure 😀"
    assert call.type == "function_call" and call.name == "get_weather" and json.loads(call.arguments) == ARGS
    assert final.usage.output_tokens == len(FULL)


async def test_responses_body(server):
    server.script = Script(TEXT_ONLY)
    response = await oai(server.url).responses.create(model="DeepSeek-V4-Pro", input="hi")
    assert response.status == "completed" and response.output_text == "Hello 世界!"


async def test_responses_length_mid_tool_call_is_incomplete(server):
    server.script = Script(CUT, "length")
    stream = await oai(server.url).responses.create(model="DeepSeek-V4-Pro", input="hi", stream=True)
    events = [e async for e in stream]
    last = events[-1]
    assert last.type == "response.incomplete"
    assert (
        last.response.status == "incomplete"
        and last.response.incomplete_details.reason == "max_output_tokens"
    )
    call = last.response.output[-1]
    assert call.status == "incomplete" and json.loads(call.arguments) == {"city": "Par"}


# -- Messages ---------------------------------------------------------------------------------------


async def test_messages_stream_final_message(server):
    async with anth(server.url).messages.stream(
        model="DeepSeek-V4-Pro", max_tokens=100, messages=MESSAGES, tools=ANTHROPIC_TOOLS,
        thinking={"type": "enabled", "budget_tokens": 50},
    ) as stream:  # fmt: skip
        text = "".join([t async for t in stream.text_stream])
        final = await stream.get_final_message()
    assert text == "Sure 😀"
    thinking, block, tool = final.content
    assert thinking.type == "thinking" and thinking.thinking == "Thinking 中文." and thinking.signature
    assert block.type == "text" and block.text == "Sure 😀"
    assert tool.type == "tool_use" and tool.id.startswith("toolu_") and tool.input == ARGS
    assert final.stop_reason == "tool_use"
    assert (final.usage.input_tokens, final.usage.cache_read_input_tokens) == (20, 10)
    assert final.usage.output_tokens == len(FULL)


async def test_messages_body(server):
    message = await anth(server.url).messages.create(
        model="DeepSeek-V4-Pro", max_tokens=100, messages=MESSAGES
    )
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    assert message.content[2].input == ARGS and message.stop_reason == "tool_use"


async def test_messages_max_tokens_mid_tool_call(server):
    server.script = Script(CUT, "length", step=1)
    async with anth(server.url).messages.stream(
        model="DeepSeek-V4-Pro", max_tokens=100, messages=MESSAGES
    ) as stream:
        final = await stream.get_final_message()
    assert final.stop_reason == "max_tokens"
    assert final.content[-1].type == "tool_use" and final.content[-1].input == {"city": "Par"}


async def test_messages_stream_error_raises(server):
    server.script = Script(TEXT_ONLY[:3], "error")
    with pytest.raises(anthropic.APIStatusError, match="engine failed"):
        async with anth(server.url).messages.stream(
            model="DeepSeek-V4-Pro", max_tokens=100, messages=MESSAGES
        ) as stream:
            await stream.get_final_message()
