"""Where dsi deliberately differs from deepseek-recipe 0.2.0. Acceptance follows deepseek-recipe
(see test_acceptance) except here: dsi accepts more where a specification requires it, honours
parameters deepseek-recipe ignores, and refuses, with a 400, what it cannot honour (unknown
fields, hosted tools, tool search, stored state). Each test checks dsi and checks that
deepseek-recipe still behaves differently (so a fixed oracle shows up here)."""

from __future__ import annotations

from typing import Any

import deepseek_recipe as dr
import pytest

from dsi.recipe import ModelVersion, Recipe, RequestError
from dsi.recipe.conversation import AssistantMessage
from tests.dsi.recipe.oracle import encoding

V4 = "DeepSeek-V4-Pro"
USER = [{"role": "user", "content": "hi"}]
TOOLS_M = [{"name": "f", "input_schema": {"type": "object", "properties": {"a": {"type": "string"}}}}]


@pytest.fixture(scope="module")
def recipe() -> Recipe:
    return Recipe()


def theirs(protocol: str, body: dict[str, Any]) -> Any:
    cls = {"chat": dr.ChatCompletionRequest, "responses": dr.ResponsesRequest, "messages": dr.MessagesRequest}
    return cls[protocol](body).convert(dr.ConversionOptions())


def their_error(protocol: str, body: dict[str, Any]) -> str | None:
    try:
        theirs(protocol, body)
    except (dr.ConversionError, ValueError) as exc:
        return str(exc)
    return None


def test_unknown_model_is_404_model_not_found(recipe: Recipe) -> None:
    """OpenAI: 404 ``model_not_found``; Anthropic: 404 ``not_found_error``. deepseek-recipe: 400."""
    body = {"model": "gpt-4o", "messages": USER}
    with pytest.raises(RequestError) as info:
        recipe.prepare("chat", body)
    assert (info.value.status, info.value.api_code) == (404, "model_not_found")
    with pytest.raises(dr.ConversionError) as their:
        theirs("chat", body)
    assert their.value.status_code == 400


def test_unknown_parameters_are_refused(recipe: Recipe) -> None:
    """Both APIs refuse unknown request fields; deepseek-recipe ignores them."""
    for protocol, body in (
        ("chat", {"model": V4, "messages": USER, "frobnicate": 1}),
        ("messages", {"model": V4, "max_tokens": 9, "messages": USER, "frobnicate": 1}),
    ):
        with pytest.raises(RequestError) as info:
            recipe.prepare(protocol, body)  # type: ignore[arg-type]
        assert info.value.param == "frobnicate"
        assert their_error(protocol, body) is None


def test_chat_max_completion_tokens_is_honoured(recipe: Recipe) -> None:
    """OpenAI's current name for the output limit; deepseek-recipe ignores it."""
    body = {"model": V4, "messages": USER, "max_completion_tokens": 77}
    assert recipe.prepare("chat", body).max_tokens == 77
    assert theirs("chat", body).inference_options.max_tokens is None


def test_chat_developer_role_is_accepted(recipe: Recipe) -> None:
    """OpenAI Chat has a ``developer`` role; deepseek-recipe refuses it. dsi renders it as the
    Responses ``developer`` item is rendered: a user turn in V4, a system message in V4.1."""
    body = {
        "model": V4,
        "messages": [{"role": "developer", "content": "Be terse."}, *USER],
        "thinking": {"type": "disabled"},
    }
    assert recipe.prepare("chat", body).prompt.text == (
        "<｜begin▁of▁sentence｜><｜User｜>Be terse.\n\nhi<｜Assistant｜></think>"
    )
    assert "developer" in (their_error("chat", body) or "")
    as_responses = {
        "model": V4,
        "input": [{"role": "developer", "content": "Be terse."}, *USER],
        "reasoning": {"effort": "none"},
    }
    assert recipe.prepare("responses", as_responses).prompt.text == recipe.prepare("chat", body).prompt.text


def test_refusal_parts_are_text(recipe: Recipe) -> None:
    """Both OpenAI APIs allow refusal content in assistant history; deepseek-recipe refuses it."""
    body = {
        "model": V4,
        "thinking": {"type": "disabled"},
        "messages": [
            *USER,
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't."}]},
            *USER,
        ],
    }
    assert "<｜Assistant｜></think>I can't.<｜end▁of▁sentence｜>" in recipe.prepare("chat", body).prompt.text
    assert their_error("chat", body) is not None


def test_messages_tool_choice_any_requires_a_call(recipe: Recipe) -> None:
    """Anthropic ``any``: the model must use one of the tools. deepseek-recipe: ``auto``."""
    body = {
        "model": V4,
        "max_tokens": 9,
        "messages": USER,
        "tools": TOOLS_M,
        "tool_choice": {"type": "any"},
        "thinking": {"type": "disabled"},
    }
    ours = recipe.prepare("messages", body)
    assert ours.tool_choice == "required"
    assert ours.prompt.text.endswith("<｜Assistant｜></think>\n\n<｜DSML｜tool_calls>\n")
    assert theirs("messages", body).conversation.tool_choice == "auto"
    # thinking on (Anthropic refuses it; deepseek-recipe takes it as auto): deepseek-recipe's
    # prompt, and the call is required after the reasoning
    thinking = {**body, "thinking": {"type": "enabled", "budget_tokens": 1024}}
    ours = recipe.prepare("messages", thinking)
    conv = theirs("messages", thinking).conversation
    assert ours.prompt.text == encoding(ModelVersion.V4).render_conversation(conv).prompt
    assert ours.tool_choice == "required" and ours.ends_in_thinking and conv.tool_choice == "auto"


def test_messages_final_assistant_message_is_a_prefill(recipe: Recipe) -> None:
    """Anthropic: a final assistant message is continued. deepseek-recipe closes it and starts a
    new assistant turn. dsi renders it as deepseek-recipe renders a continued (prefix) message."""
    body = {
        "model": V4,
        "max_tokens": 9,
        "thinking": {"type": "disabled"},
        "messages": [*USER, {"role": "assistant", "content": "The answer is"}],
    }
    ours = recipe.prepare("messages", body)
    assert ours.prompt.text.endswith("<｜User｜>hi<｜Assistant｜></think>The answer is")
    conv = theirs("messages", body).conversation
    assert (
        encoding(ModelVersion.V4)
        .render_conversation(conv)
        .prompt.endswith("The answer is<｜end▁of▁sentence｜><｜Assistant｜></think>")
    )
    last = conv.messages[-1]
    prefixed = dr.Conversation(
        [*conv.messages[:-1], dr.AssistantMessage(last.content, None, None, True)], thinking_mode=False
    )
    assert ours.prompt.text == encoding(ModelVersion.V4).render_conversation(prefixed).prompt
    assert (
        isinstance(ours.conversation.messages[-1], AssistantMessage) and ours.conversation.messages[-1].prefix
    )


def test_messages_custom_tools_and_redacted_thinking_are_accepted(recipe: Recipe) -> None:
    """``type: "custom"`` client tools and ``redacted_thinking`` history blocks are part of the
    Messages API; deepseek-recipe refuses both. Redacted reasoning is not rendered."""
    body = {
        "model": V4,
        "max_tokens": 9,
        "tools": [{"type": "custom", **TOOLS_M[0]}],
        "messages": [
            *USER,
            {
                "role": "assistant",
                "content": [{"type": "redacted_thinking", "data": "xyz"}, {"type": "text", "text": "ok"}],
            },
            *USER,
        ],
    }
    assert "xyz" not in recipe.prepare("messages", body).prompt.text
    assert their_error("messages", body) is not None


def test_strict_schemas_keep_keywords_deepseek_recipe_drops(recipe: Recipe) -> None:
    """Strict tool schemas: dsi adds ``additionalProperties: false`` and ``required`` and orders
    the keywords as deepseek-recipe does, but keeps the keywords its typed model drops
    (``$defs`` that a ``$ref`` needs, ``minLength``, ...)."""
    params = {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/s"}, "b": {"type": "string", "minLength": 2}},
        "$defs": {"s": {"type": "string"}},
    }
    body = {
        "model": V4,
        "messages": USER,
        "thinking": {"type": "disabled"},
        "tools": [{"type": "function", "function": {"name": "f", "strict": True, "parameters": params}}],
    }
    ours = recipe.prepare("chat", body).tools[0].parameters
    assert ours["$defs"] == {"s": {"type": "string"}} and ours["properties"]["b"]["minLength"] == 2
    assert ours["required"] == ["a", "b"] and ours["additionalProperties"] is False
    their_params = theirs("chat", body).conversation.tools[0].parameters
    assert "$defs" not in their_params and "minLength" not in their_params["properties"]["b"]


# (protocol, body, the param dsi's 400 names): deepseek-recipe accepts each, ignoring or dropping
# what dsi cannot honour
CANNOT_HONOUR: dict[str, tuple[str, dict[str, Any], str]] = {
    "chat-logit-bias": ("chat", {"model": V4, "messages": USER, "logit_bias": {"42": 5}}, "logit_bias"),
    "chat-function-defer-loading": (
        "chat",
        {
            "model": V4,
            "messages": USER,
            "tools": [{"type": "function", "function": {"name": "f", "defer_loading": True}}],
        },
        "tools[0].function.defer_loading",
    ),
    "responses-hosted-tool": (
        "responses",
        {"model": V4, "input": "hi", "tools": [{"type": "file_search"}]},
        "tools[0].type",
    ),
    "responses-namespace-tool": (
        "responses",
        {
            "model": V4,
            "input": "hi",
            "tools": [{"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "f"}]}],
        },
        "tools[0].tools",
    ),
    "responses-item-reference": (
        "responses",
        {"model": V4, "input": [{"type": "item_reference", "id": "x"}]},
        "input[0].type",
    ),
    "responses-custom-tool-call": (
        "responses",
        {
            "model": V4,
            "input": [
                *USER,
                {"type": "custom_tool_call", "call_id": "c", "name": "apply_patch", "input": "x"},
                {"type": "custom_tool_call_output", "call_id": "c", "output": "ok"},
            ],
        },
        "input[1].type",
    ),
    "messages-tool-strict": (
        "messages",
        {"model": V4, "max_tokens": 9, "messages": USER, "tools": [{**TOOLS_M[0], "strict": True}]},
        "tools[0].strict",
    ),
    "messages-thinking-display": (
        "messages",
        {
            "model": V4,
            "max_tokens": 9,
            "messages": USER,
            "thinking": {"type": "adaptive", "display": "omitted"},
        },
        "thinking.display",
    ),
    "messages-tool-reference": (
        "messages",
        {
            "model": V4,
            "max_tokens": 9,
            "tools": TOOLS_M,
            "messages": [
                *USER,
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t",
                            "content": [{"type": "tool_reference", "tool_name": "f"}],
                        }
                    ],
                },
            ],
        },
        "messages[2].content[0].content[0].type",
    ),
    "messages-output-format-json-object": (
        "messages",
        {
            "model": V4,
            "max_tokens": 9,
            "messages": USER,
            "output_config": {"format": {"type": "json_object"}},
        },
        "output_config.format.type",
    ),
    "messages-negative-top-k": (
        "messages",
        {"model": V4, "max_tokens": 9, "messages": USER, "top_k": -1},
        "top_k",
    ),
}


@pytest.mark.parametrize("name", sorted(CANNOT_HONOUR))
def test_what_dsi_cannot_honour_is_refused(recipe: Recipe, name: str) -> None:
    """deepseek-recipe accepts these and drops or ignores the part; dsi says so with a 400 rather
    than answer a request it did not carry out."""
    protocol, body, param = CANNOT_HONOUR[name]
    with pytest.raises(RequestError) as info:
        recipe.prepare(protocol, body)  # type: ignore[arg-type]
    assert (info.value.status, info.value.param) == (400, param)
    assert their_error(protocol, body) is None
