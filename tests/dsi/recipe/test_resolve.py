"""Resolved requests: what reaches the gateway and the engine besides the prompt."""

from __future__ import annotations

import pytest

from dsi.engine.params import SamplingParams
from dsi.recipe import ModelVersion, Recipe
from dsi.recipe.conversation import Effort, ImageRef

USER = [{"role": "user", "content": "hi"}]
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}}


@pytest.fixture(scope="module")
def recipe() -> Recipe:
    return Recipe({"dsi-tiny": ModelVersion.V4})


def test_alias_serves_the_v4_format(recipe: Recipe) -> None:
    req = recipe.prepare("chat", {"model": "dsi-tiny", "messages": USER})
    official = recipe.prepare("chat", {"model": "DeepSeek-V4-Pro", "messages": USER})
    assert req.model == "dsi-tiny" and req.model_version is ModelVersion.V4
    assert req.prompt_token_ids == official.prompt_token_ids


def test_passthrough_and_engine_params(recipe: Recipe) -> None:
    req = recipe.prepare(
        "chat",
        {
            "model": "dsi-tiny",
            "messages": USER,
            "thinking": {"type": "disabled"},
            "temperature": 0.2,
            "top_p": 0.9,
            "seed": 7,
            "stop": "END",
            "max_tokens": 33,
            "logprobs": True,
            "top_logprobs": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
            "user": "u-1",
            "metadata": {"k": "v"},
            "frequency_penalty": 0.5,
            "presence_penalty": -1.25,
            "parallel_tool_calls": False,
        },
    )
    assert (req.stream, req.include_usage, req.user, req.metadata) == (True, True, "u-1", {"k": "v"})
    assert (req.stop, req.max_tokens, req.seed, req.frequency_penalty) == (("END",), 33, 7, 0.5)
    assert not req.parallel_tool_calls and not req.thinking and not req.ends_in_thinking
    params = req.sampling_params()
    params.validate(129_280)
    assert params == SamplingParams(
        max_tokens=33,
        temperature=0.2,
        top_p=0.9,
        seed=7,
        logprobs=True,
        top_logprobs=2,
        frequency_penalty=0.5,
        presence_penalty=-1.25,
    )


def test_thinking_mode_ignores_temperature_and_ends_in_think(recipe: Recipe) -> None:
    req = recipe.prepare("chat", {"model": "dsi-tiny", "messages": USER, "temperature": 0.1})
    assert req.thinking and req.ends_in_thinking and req.temperature == 1.0
    assert req.prompt.text.endswith("<｜Assistant｜><think>")
    assert req.max_tokens == 65_536


@pytest.mark.parametrize(
    ("effort", "expected", "max_tokens"),
    [
        ("minimal", Effort.LOW, 65_536),
        ("low", Effort.LOW, 65_536),
        ("medium", Effort.HIGH, 65_536),
        ("high", Effort.HIGH, 65_536),
        ("xhigh", Effort.XHIGH, 65_536),
        ("max", Effort.MAX, 131_072),
        ("none", None, 8192),
    ],
)
def test_effort_levels(recipe: Recipe, effort: str, expected: Effort | None, max_tokens: int) -> None:
    req = recipe.prepare("responses", {"model": "dsi-tiny", "input": "hi", "reasoning": {"effort": effort}})
    assert req.effort is expected and req.thinking is (expected is not None) and req.max_tokens == max_tokens


def test_thinking_disabled_wins_over_effort(recipe: Recipe) -> None:
    req = recipe.prepare(
        "chat",
        {"model": "dsi-tiny", "messages": USER, "reasoning_effort": "max", "thinking": {"type": "disabled"}},
    )
    assert not req.thinking and req.effort is None


def test_default_thinking_off() -> None:
    off = Recipe(default_thinking=False)
    assert not off.prepare("chat", {"model": "DeepSeek-V4-Pro", "messages": USER}).thinking
    assert off.prepare(
        "chat", {"model": "DeepSeek-V4-Pro", "messages": USER, "reasoning_effort": "low"}
    ).thinking


def test_images_are_references_for_v41_only(recipe: Recipe) -> None:
    body = {
        "model": "DeepSeek-V4.1-Flash",
        "messages": [{"role": "user", "content": [IMAGE, {"type": "text", "text": "what?"}]}],
        "thinking": {"type": "disabled"},  # no <｜System｜>: within the shipped vocabulary
    }
    v41 = recipe.prepare("chat", body)
    assert v41.images == (ImageRef("data:image/png;base64,AAAA", "low"),)
    assert "<｜image｜>\n\nwhat?" in v41.prompt.text
    v4 = recipe.prepare("chat", {**body, "model": "DeepSeek-V4-Pro"})
    assert v4.images == () and "[Unsupported Image]\n\nwhat?" in v4.prompt.text


def test_named_tool_and_strict_schema(recipe: Recipe) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": n,
                "strict": True,
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            },
        }
        for n in ("a", "b")
    ]
    req = recipe.prepare(
        "chat",
        {
            "model": "dsi-tiny",
            "messages": USER,
            "tools": tools,
            "tool_choice": {"type": "function", "function": {"name": "b"}},
            "thinking": {"type": "disabled"},
        },
    )
    assert (req.tool_choice, req.forced_tool, [t.name for t in req.tools]) == ("required", "b", ["b"])
    assert req.tools[0].strict and req.tools[0].parameters["required"] == ["q"]
    assert req.prompt.text.endswith("</think>\n\n<｜DSML｜tool_calls>\n") and not req.ends_in_thinking


def test_messages_clamps_max_tokens_and_echoes_responses_settings(recipe: Recipe) -> None:
    req = recipe.prepare("messages", {"model": "dsi-tiny", "max_tokens": 10**6, "messages": USER})
    assert req.max_tokens == 393_216
    resp = recipe.prepare(
        "responses",
        {
            "model": "dsi-tiny",
            "input": "hi",
            "instructions": "Be brief.",
            "max_output_tokens": 50,
            "text": {"format": {"type": "json_schema", "name": "o", "schema": {"type": "object"}}},
        },
    )
    assert resp.echo["instructions"] == "Be brief." and resp.echo["max_output_tokens"] == 50
    assert resp.response_format.kind == "json_schema" and resp.max_tokens == 50


# ignore_eos: an extension field (vLLM's); Chat Completions and Responses at the top level,
# Messages in metadata. A non-boolean is a 400 (test_bad_input).
IGNORE_EOS_BODIES = {
    "chat": ({"messages": USER, "ignore_eos": True}, {"messages": USER}),
    "responses": ({"input": "hi", "ignore_eos": True}, {"input": "hi"}),
    "messages": (
        {"max_tokens": 8, "messages": USER, "metadata": {"user_id": "u", "ignore_eos": True}},
        {"max_tokens": 8, "messages": USER, "metadata": {"user_id": "u"}},
    ),
}


@pytest.mark.parametrize("protocol", sorted(IGNORE_EOS_BODIES))
def test_ignore_eos_reaches_the_engine_from_every_protocol(recipe: Recipe, protocol: str) -> None:
    asked, plain = IGNORE_EOS_BODIES[protocol]
    req = recipe.prepare(protocol, {"model": "dsi-tiny", **asked})
    assert req.ignore_eos and req.sampling_params().ignore_eos
    req = recipe.prepare(protocol, {"model": "dsi-tiny", **plain})
    assert not req.ignore_eos and not req.sampling_params().ignore_eos
    if protocol == "messages":
        assert req.metadata == {"user_id": "u"}
