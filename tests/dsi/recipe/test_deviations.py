"""Where deepseek-recipe 0.2.0 departs from the OpenAI / Anthropic wire specifications, dsi
follows the specifications. Each test states the specification's rule, checks dsi, and checks
that deepseek-recipe still behaves differently (so a fixed oracle shows up here)."""

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


def test_unknown_reasoning_effort_is_refused(recipe: Recipe) -> None:
    """OpenAI lists the effort values; deepseek-recipe takes an unknown one as ``max``."""
    body = {"model": V4, "messages": USER, "reasoning_effort": "ultra"}
    with pytest.raises(RequestError):
        recipe.prepare("chat", body)
    assert theirs("chat", body).conversation.reasoning_effort == "max"


def test_forcing_a_tool_without_tools_is_refused(recipe: Recipe) -> None:
    """OpenAI: ``tool_choice`` is only allowed when ``tools`` are given; deepseek-recipe falls back
    to ``auto``."""
    body = {"model": V4, "messages": USER, "tool_choice": "required", "thinking": {"type": "disabled"}}
    with pytest.raises(RequestError) as info:
        recipe.prepare("chat", body)
    assert info.value.param == "tool_choice"
    assert theirs("chat", body).conversation.tool_choice == "auto"


def test_tool_names_longer_than_64_are_refused(recipe: Recipe) -> None:
    body = {"model": V4, "messages": USER, "tools": [{"type": "function", "function": {"name": "f" * 65}}]}
    with pytest.raises(RequestError):
        recipe.prepare("chat", body)
    assert their_error("chat", body) is None


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


def test_messages_max_tokens_is_required(recipe: Recipe) -> None:
    body = {"model": V4, "messages": USER}
    with pytest.raises(RequestError) as info:
        recipe.prepare("messages", body)
    assert info.value.param == "max_tokens"
    assert their_error("messages", body) is None


def test_messages_temperature_range_is_0_to_1(recipe: Recipe) -> None:
    body = {"model": V4, "max_tokens": 9, "messages": USER, "temperature": 1.5}
    with pytest.raises(RequestError):
        recipe.prepare("messages", body)
    assert their_error("messages", body) is None


def test_messages_system_role_is_refused(recipe: Recipe) -> None:
    """Messages roles are ``user`` and ``assistant``; deepseek-recipe wraps a system-role message
    in ``<system-reminder>`` tags."""
    body = {"model": V4, "max_tokens": 9, "messages": [{"role": "system", "content": "s"}, *USER]}
    with pytest.raises(RequestError):
        recipe.prepare("messages", body)
    assert (
        theirs("messages", body).conversation.messages[0].content
        == "<system-reminder>\ns\n</system-reminder>"
    )


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
    with pytest.raises(RequestError):  # forcing a tool with thinking on is refused, as Anthropic does
        recipe.prepare(
            "messages", {**body, "thinking": {"type": "enabled", "budget_tokens": 1024}, "max_tokens": 4096}
        )


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


def test_messages_thinking_budget_is_checked(recipe: Recipe) -> None:
    """Anthropic: ``budget_tokens`` >= 1024 and below ``max_tokens``."""
    body = {
        "model": V4,
        "max_tokens": 2000,
        "messages": USER,
        "thinking": {"type": "enabled", "budget_tokens": 3000},
    }
    with pytest.raises(RequestError):
        recipe.prepare("messages", body)
    assert their_error("messages", body) is None


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
