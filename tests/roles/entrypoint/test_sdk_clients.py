"""The official openai and anthropic SDKs against a live gateway with the tiny model.

The tiny model's weights are random, so tool calls are forced through structured output
(tool_choice required / named): the grammar makes the output a valid DSML tool call.
"""

import json

import anthropic
import openai
import pytest

pytestmark = pytest.mark.slow

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string", "maxLength": 12}},
                                                "required": ["city"]}}}
RESP_TOOL = {"type": "function", "name": "get_weather", "description": "Weather in a city",
             "parameters": WEATHER["function"]["parameters"]}
ANTHROPIC_TOOL = {"name": "get_weather", "description": "Weather in a city",
                  "input_schema": WEATHER["function"]["parameters"]}
MSGS = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture
def oai(gateway):
    return openai.OpenAI(base_url=f"{gateway}/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture
def claude(gateway):
    return anthropic.Anthropic(base_url=gateway, api_key="none", max_retries=0, timeout=120)


def test_chat_completions_plain_stream_and_non_stream(oai):
    out = oai.chat.completions.create(model="dsi-tiny", messages=MSGS, max_tokens=6, seed=1)
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 6
    chunks = list(oai.chat.completions.create(model="dsi-tiny", messages=MSGS, max_tokens=6, stream=True,
                                              stream_options={"include_usage": True}, reasoning_effort="none"))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert chunks[-2].choices[0].finish_reason == "length"


def test_chat_completions_forced_tool_call(oai):
    kwargs = {"model": "dsi-tiny", "messages": MSGS, "tools": [WEATHER], "max_tokens": 120, "reasoning_effort": "none",
              "temperature": 0,
              "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    out = oai.chat.completions.create(**kwargs)
    call = out.choices[0].message.tool_calls[0]
    assert out.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)
    with oai.chat.completions.stream(**kwargs) as stream:
        final = stream.get_final_completion()
    streamed = final.choices[0].message.tool_calls[0]
    assert streamed.function.name == "get_weather" and "city" in json.loads(streamed.function.arguments)


def test_responses_stream_and_non_stream_with_tools(oai):
    kwargs = {"model": "dsi-tiny", "input": "What is the weather in Paris?", "tools": [RESP_TOOL],
              "tool_choice": "required", "max_output_tokens": 120, "reasoning": {"effort": "none"},
              "temperature": 0}
    resp = oai.responses.create(**kwargs)
    calls = [item for item in resp.output if item.type == "function_call"]
    assert resp.status == "completed" and calls[0].name == "get_weather"
    assert "city" in json.loads(calls[0].arguments)
    with oai.responses.stream(**kwargs) as stream:
        final = stream.get_final_response()
    assert [i.type for i in final.output if i.type == "function_call"] == ["function_call"]
    plain = oai.responses.create(model="dsi-tiny", input="Hi", max_output_tokens=5)
    assert plain.status == "incomplete" and plain.incomplete_details.reason == "max_output_tokens"


def test_anthropic_messages_create_and_stream_with_tools_and_thinking(claude):
    msg = claude.messages.create(model="dsi-tiny", max_tokens=120, messages=MSGS, tools=[ANTHROPIC_TOOL], extra_body={"temperature": 0},
                                 tool_choice={"type": "tool", "name": "get_weather"}, thinking={"type": "disabled"})
    tool_uses = [b for b in msg.content if b.type == "tool_use"]
    assert msg.stop_reason == "tool_use" and tool_uses[0].name == "get_weather" and tool_uses[0].id.startswith("toolu_")
    assert isinstance(tool_uses[0].input["city"], str)
    # Thinking is on by default (DeepSeek's rule for an absent effort); an explicit
    # {"type": "enabled"} needs max_tokens above budget_tokens (>= 1024), too slow for the tiny model.
    with claude.messages.stream(model="dsi-tiny", max_tokens=8, messages=MSGS) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "max_tokens" and final.content[0].type == "thinking"
    assert final.usage.output_tokens == 8
