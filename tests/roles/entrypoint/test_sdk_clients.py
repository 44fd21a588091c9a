"""The official openai and anthropic SDKs against a live gateway with the tiny model.

The tiny model's weights are random, so tool calls are forced through structured output
(tool_choice required / named): the grammar makes the output a valid DSML tool call.
"""

import json

import anthropic
import openai
import pytest

from dsi.engine.engine import Engine, EngineConfig
from dsi.engine.params import SamplingParams
from dsi.model.prepare import ensure_model
from dsi.model.weights import load_model
from dsi.recipe import ModelVersion, Recipe
from dsi.recipe.detok import byte_table
from dsi.tokenizer import load_tokenizer
from tests.dsi.cli.procs import SHARED_MODEL_DIR

pytestmark = [pytest.mark.slow, pytest.mark.concurrent]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"],
        },
    },
}
RESP_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": WEATHER["function"]["parameters"],
}
ANTHROPIC_TOOL = {
    "name": "get_weather",
    "description": "Weather in a city",
    "input_schema": WEATHER["function"]["parameters"],
}
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
    chunks = list(
        oai.chat.completions.create(
            model="dsi-tiny",
            messages=MSGS,
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
            reasoning_effort="none",
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert chunks[-2].choices[0].finish_reason == "length"


def test_chat_completions_forced_tool_call(oai):
    kwargs = {
        "model": "dsi-tiny",
        "messages": MSGS,
        "tools": [WEATHER],
        "max_tokens": 120,
        "reasoning_effort": "none",
        "temperature": 0,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    }
    out = oai.chat.completions.create(**kwargs)
    call = out.choices[0].message.tool_calls[0]
    assert out.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)
    with oai.chat.completions.stream(**kwargs) as stream:
        final = stream.get_final_completion()
    streamed = final.choices[0].message.tool_calls[0]
    assert streamed.function.name == "get_weather" and "city" in json.loads(streamed.function.arguments)


def test_responses_stream_and_non_stream_with_tools(oai):
    kwargs = {
        "model": "dsi-tiny",
        "input": "What is the weather in Paris?",
        "tools": [RESP_TOOL],
        "tool_choice": "required",
        "max_output_tokens": 120,
        "reasoning": {"effort": "none"},
        "temperature": 0,
    }
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
    msg = claude.messages.create(
        model="dsi-tiny",
        max_tokens=120,
        messages=MSGS,
        tools=[ANTHROPIC_TOOL],
        extra_body={"temperature": 0},
        tool_choice={"type": "tool", "name": "get_weather"},
        thinking={"type": "disabled"},
    )
    tool_uses = [b for b in msg.content if b.type == "tool_use"]
    assert (
        msg.stop_reason == "tool_use"
        and tool_uses[0].name == "get_weather"
        and tool_uses[0].id.startswith("toolu_")
    )
    assert isinstance(tool_uses[0].input["city"], str)
    # Thinking is on by default (DeepSeek's rule for an absent effort); an explicit
    # {"type": "enabled"} needs max_tokens above budget_tokens (>= 1024), too slow for the tiny model.
    with claude.messages.stream(model="dsi-tiny", max_tokens=8, messages=MSGS) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "max_tokens" and final.content[0].type == "thinking"
    assert final.usage.output_tokens == 8


# -- logprobs and penalties: the engine's own values, through the disaggregated cluster ----------

LP_CHAT = {
    "model": "dsi-tiny",
    "messages": MSGS,
    "max_tokens": 6,
    "temperature": 0,
    "reasoning_effort": "none",
}
LP_RESPONSES = {
    "model": "dsi-tiny",
    "input": "What is the weather in Paris?",
    "max_output_tokens": 6,
    "temperature": 0,
    "reasoning": {"effort": "none"},
}


def engine_run(protocol, body, **sampling):
    """The tokens, logprobs and top 3 an in-process engine gives the request's prompt (greedy)."""
    cfg, w = load_model(ensure_model(SHARED_MODEL_DIR, "tiny"))
    ids = list(Recipe({"dsi-tiny": ModelVersion.V4}).prepare(protocol, body).prompt_token_ids)
    engine = Engine(cfg, w, EngineConfig(async_scheduling=False))
    engine.add_request(
        "r", ids, SamplingParams(max_tokens=6, temperature=0, logprobs=True, top_logprobs=3, **sampling)
    )
    outs = [o for o in engine.run_until_done() if o.request_id == "r"]
    engine.close()
    tops = [t for o in outs for t in o.new_top_logprobs]
    return outs[-1].output, outs[-1].logprobs, tops


@pytest.fixture(scope="module")
def chat_run():
    return engine_run("chat", LP_CHAT)


def spelled(token_id):
    """An id's bytes; a special id (no bytes of its own) is reported by its spelling."""
    return byte_table()[token_id] or load_tokenizer().id_to_token(token_id).encode()


def assert_engine_logprobs(entries, run):
    """``entries`` (SDK objects with token, bytes, logprob, top_logprobs) are the engine's, id by id."""
    tokens, logprobs, tops = run
    assert not {1, 128821, 128822, 128825} & set(tokens)  # all content: every id is listed
    assert [bytes(e.bytes) for e in entries] == [spelled(t) for t in tokens]
    assert [e.logprob for e in entries] == pytest.approx(logprobs, abs=1e-4)
    for e, top in zip(entries, tops, strict=True):
        assert [bytes(t.bytes) for t in e.top_logprobs] == [spelled(i) for i, _ in top]
        assert [t.logprob for t in e.top_logprobs] == pytest.approx([lp for _, lp in top], abs=1e-4)


def test_chat_completions_logprobs_are_the_engines(oai, chat_run):
    out = oai.chat.completions.create(**LP_CHAT, logprobs=True, top_logprobs=3)
    assert_engine_logprobs(out.choices[0].logprobs.content, chat_run)
    chunks = list(oai.chat.completions.create(**LP_CHAT, logprobs=True, top_logprobs=3, stream=True))
    streamed = [e for c in chunks for ch in c.choices if ch.logprobs for e in ch.logprobs.content]
    assert_engine_logprobs(streamed, chat_run)
    # LengthFinishReasonError is the accumulator's way to say "length"
    with (
        pytest.raises(openai.LengthFinishReasonError) as cut,
        oai.chat.completions.stream(**LP_CHAT, logprobs=True, top_logprobs=3) as stream,
    ):
        stream.get_final_completion()
    assert_engine_logprobs(cut.value.completion.choices[0].logprobs.content, chat_run)


def test_responses_logprobs_are_the_engines(oai):
    run = engine_run("responses", LP_RESPONSES)
    kwargs = {**LP_RESPONSES, "include": ["message.output_text.logprobs"], "top_logprobs": 3}
    resp = oai.responses.create(**kwargs)
    part = next(item for item in resp.output if item.type == "message").content[0]
    assert_engine_logprobs(part.logprobs, run)
    events = list(oai.responses.create(**kwargs, stream=True))
    deltas = [lp for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    assert [lp.logprob for lp in deltas] == pytest.approx(run[1], abs=1e-4)
    done = next(e for e in events if e.type == "response.output_text.done")
    assert_engine_logprobs(done.logprobs, run)


def test_penalties_reach_the_engine(oai, chat_run):
    """A presence penalty of -2 makes the tiny model repeat itself: the cluster's output is the
    in-process engine's with the same penalty, not the one without."""
    tokens, _, _ = engine_run("chat", LP_CHAT, presence_penalty=-2.0, frequency_penalty=0.5)
    assert tokens != chat_run[0]
    out = oai.chat.completions.create(**LP_CHAT, logprobs=True, presence_penalty=-2.0, frequency_penalty=0.5)
    assert [bytes(e.bytes) for e in out.choices[0].logprobs.content] == [spelled(t) for t in tokens]
