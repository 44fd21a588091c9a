"""Acceptance follows deepseek-recipe 0.2.0: requests it accepts beyond the specifications are
accepted and render identically (prompt text, special ranges, token ids); requests it refuses
that dsi once let through are refused, with a 400 naming the parameter. V4.1 bodies are encoded
with a stand-in V4.1 vocabulary (the shipped one plus ``<｜System｜>``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import deepseek_recipe as dr
import pytest

from dsi.recipe import ModelVersion, Recipe, RequestError, ServedModel
from dsi.recipe.models import ModelTable
from tests.dsi.recipe.oracle import encoding, v41_encoding, version_of, write_v41_tokenizer

V4, V41 = "DeepSeek-V4-Pro", "DeepSeek-V4.1-Flash"
REQUESTS = {
    "chat": dr.ChatCompletionRequest,
    "responses": dr.ResponsesRequest,
    "messages": dr.MessagesRequest,
}
USER = [{"role": "user", "content": "hi json"}]
IMAGE_URL = "https://example.invalid/cat.png"
FN = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
TOOL_M = {"name": "f", "input_schema": {"type": "object", "properties": {"a": {"type": "string"}}}}
TOOL_USE = {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": "x"}}
TOOL_RESULT = {"type": "tool_result", "tool_use_id": "t1", "content": "r"}
FC = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
FC_OUT = {"type": "function_call_output", "call_id": "c1", "output": "r"}
REASONING = {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "because"}]}
ANSWER = {"role": "assistant", "content": "a"}


def chat(model: str = V4, **fields: Any) -> tuple[str, dict[str, Any]]:
    return "chat", {"model": model, "messages": USER, **fields}


def resp(model: str = V4, **fields: Any) -> tuple[str, dict[str, Any]]:
    return "responses", {"model": model, "input": "hi json", **fields}


def msgs(model: str = V4, **fields: Any) -> tuple[str, dict[str, Any]]:
    return "messages", {"model": model, "max_tokens": 4096, "messages": USER, **fields}


def m_user(*blocks: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": list(blocks)}]


def document(source: dict[str, Any]) -> dict[str, Any]:
    return {"type": "document", "source": source}


ACCEPTED: dict[str, tuple[str, dict[str, Any]]] = {
    # Messages
    "messages-budget-equal-to-max-tokens": msgs(thinking={"type": "enabled", "budget_tokens": 4096}),
    "messages-budget-above-max-tokens": msgs(
        max_tokens=100, thinking={"type": "enabled", "budget_tokens": 5000}
    ),
    "messages-budget-below-1024": msgs(thinking={"type": "enabled", "budget_tokens": 10}),
    "messages-budget-missing": msgs(thinking={"type": "enabled"}),
    "messages-budget-v41": msgs(V41, max_tokens=1024, thinking={"type": "enabled", "budget_tokens": 1024}),
    "messages-no-max-tokens": ("messages", {"model": V4, "messages": USER}),
    "messages-temperature-2": msgs(temperature=2, thinking={"type": "disabled"}),
    "messages-effort-ultra": msgs(output_config={"effort": "ultra"}),
    "messages-system-role": msgs(messages=[{"role": "system", "content": "Be brief."}, *USER]),
    "messages-system-role-v41": msgs(
        V41, messages=[*USER, ANSWER, {"role": "system", "content": "s"}, *USER]
    ),
    "messages-system-role-empty": msgs(messages=[{"role": "system", "content": ""}, *USER]),
    "messages-documents": msgs(
        messages=m_user(
            {"type": "text", "text": "read"},
            document({"type": "text", "media_type": "text/plain", "data": "d"}),
            document({"type": "base64", "media_type": "application/pdf", "data": "AA"}),
            document({"type": "url", "url": "https://example.invalid/a.pdf"}),
            document({"type": "content", "content": "c"}),
        )
    ),
    "messages-document-in-tool-result": msgs(
        V41,
        tools=[TOOL_M],
        messages=[
            *USER,
            {"role": "assistant", "content": [TOOL_USE]},
            {
                "role": "user",
                "content": [{**TOOL_RESULT, "content": [document({"type": "text", "data": "d"})]}],
            },
        ],
    ),
    "messages-image-jpg": msgs(
        V41,
        messages=m_user(
            {"type": "image", "source": {"type": "base64", "media_type": "image/jpg", "data": "AAAA"}}
        ),
    ),
    "messages-image-file-v4": msgs(
        messages=m_user({"type": "image", "source": {"type": "file", "file_id": "f"}})
    ),
    "messages-thinking-without-signature": msgs(
        messages=[*USER, {"role": "assistant", "content": [{"type": "thinking", "thinking": "t"}]}, *USER]
    ),
    "messages-assistant-image-and-empty-text-v4": msgs(
        messages=[
            *USER,
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": ""},
                    {"type": "text", "text": "a"},
                    {"type": "image", "source": {"type": "url", "url": IMAGE_URL}},
                ],
            },
            *USER,
        ]
    ),
    "messages-assistant-texts-joined-as-deepseek-recipe-joins-them": msgs(
        messages=[
            *USER,
            {"role": "assistant", "content": [{"type": "text", "text": t} for t in ("", "x", "", "y", "")]},
            *USER,
        ],
        thinking={"type": "disabled"},
    ),
    "messages-tool-use-input-not-an-object": msgs(
        tools=[TOOL_M],
        messages=[
            *USER,
            {"role": "assistant", "content": [{**TOOL_USE, "input": "x"}]},
            m_user(TOOL_RESULT)[0],
        ],
    ),
    "messages-tool-choice-any-without-tools": msgs(tool_choice={"type": "any"}),
    "messages-tool-name-of-128": msgs(tools=[{**TOOL_M, "name": "f" * 128}]),
    "messages-empty-system-lists": msgs(
        V41, system=[], thinking={"type": "disabled"}, messages=[{"role": "system", "content": []}, *USER]
    ),
    "messages-output-format-object-without-properties": msgs(
        output_config={"format": {"type": "json_schema", "schema": {"type": "object"}}}
    ),
    # Chat Completions
    "chat-effort-ultra": chat(reasoning_effort="ultra"),
    "chat-thinking-budget": chat(thinking={"type": "enabled", "budget_tokens": 10}),
    "chat-json-schema-without-name": chat(
        response_format={"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}
    ),
    "chat-regex-format": chat(
        V41, response_format={"type": "regex", "regex": "[a-z]+"}, thinking={"type": "disabled"}
    ),
    "chat-tool-name-of-100": chat(tools=[{"type": "function", "function": {"name": "g" * 100}}]),
    "chat-required-without-tools": chat(tool_choice="required"),
    "chat-named-without-tools": chat(tool_choice={"type": "function", "function": {"name": "f"}}),
    "chat-image-detail-original": chat(
        V41,
        messages=[
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": IMAGE_URL, "detail": "original"}}],
            }
        ],
    ),
    "chat-file-part-v4": chat(
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "file", "file": {"file_id": "f"}}],
            }
        ]
    ),
    "chat-assistant-image-v4": chat(
        messages=[
            *USER,
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "a"},
                    {"type": "image_url", "image_url": {"url": IMAGE_URL}},
                ],
            },
            *USER,
        ]
    ),
    "chat-tool-message-image-and-name": chat(
        V41,
        tools=[FN],
        messages=[
            *USER,
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {
                "role": "tool",
                "tool_call_id": "c1",
                "name": "f",
                "content": [
                    {"type": "text", "text": "r"},
                    {"type": "image_url", "image_url": {"url": IMAGE_URL}},
                ],
            },
        ],
    ),
    "chat-empty-system-messages-left-out": chat(
        V41,
        thinking={"type": "disabled"},
        messages=[{"role": "system", "content": ""}, *USER, {"role": "system", "content": []}, *USER],
    ),
    "chat-tool-choice-none-skips-schema-checks": chat(
        tool_choice="none",
        tools=[
            {"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}},
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": True}},
        ],
    ),
    "chat-strict-tool-without-parameters": chat(
        tools=[{"type": "function", "function": {"name": "f", "strict": True}}], thinking={"type": "disabled"}
    ),
    # Responses
    "responses-effort-ultra": resp(reasoning={"effort": "ultra"}),
    "responses-empty-instructions": resp(V41, instructions="", reasoning={"effort": "none"}),
    "responses-stream-options-without-stream": resp(stream_options={"include_obfuscation": False}),
    "responses-defer-loading": resp(tools=[{"type": "function", "name": "f", "defer_loading": True}]),
    "responses-dated-web-search": resp(
        tools=[{"type": "web_search_2025_08_26"}, {"type": "function", "name": "f"}],
        tool_choice={"type": "web_search"},
    ),
    "responses-instructions-alone": ("responses", {"model": V41, "instructions": "Be brief."}),
    "responses-phase": resp(input=[*USER, {**ANSWER, "phase": "final_answer"}, *USER]),
    "responses-detail-original-and-file": resp(
        V41,
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_image", "image_url": IMAGE_URL, "detail": "original"},
                    {"type": "input_file", "file_id": "f"},
                ],
            }
        ],
    ),
    "responses-image-by-file-id-v4": resp(
        input=[{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]
    ),
    "responses-reasoning-after-a-message-opens-a-turn": resp(
        tools=[{"type": "function", "name": "f"}], input=[*USER, ANSWER, REASONING, FC, FC_OUT]
    ),
    "responses-empty-reasoning-and-texts": resp(
        input=[
            *USER,
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": ""}]},
            ANSWER,
            {"role": "assistant", "content": ""},
            {"role": "assistant", "content": "b"},
            *USER,
        ]
    ),
    "responses-web-search-call-item": resp(
        input=[*USER, {"type": "web_search_call", "id": "ws", "status": "completed"}, ANSWER, *USER]
    ),
    "responses-assistant-image-v4": resp(
        input=[
            *USER,
            {"role": "assistant", "content": [{"type": "input_image", "image_url": IMAGE_URL}]},
            *USER,
        ]
    ),
}

# (protocol, body, the param dsi's 400 names); deepseek-recipe refuses each too
REFUSED: dict[str, tuple[str, dict[str, Any], str | None]] = {
    "chat-assistant-without-content-or-calls": (
        *chat(messages=[*USER, {"role": "assistant", "content": None}, *USER]),
        "messages[1].content",
    ),
    "chat-empty-tool-calls": (
        *chat(messages=[*USER, {"role": "assistant", "content": "a", "tool_calls": []}, *USER]),
        "messages[1].tool_calls",
    ),
    "chat-calls-without-results": (
        *chat(
            tools=[FN], messages=[*USER, {"role": "assistant", "content": None, "tool_calls": [CALL]}, *USER]
        ),
        "messages[1]",
    ),
    "chat-second-result-for-a-call": (
        *chat(
            tools=[FN],
            messages=[
                *USER,
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "c1", "content": "r"},
                {"role": "tool", "tool_call_id": "c1", "content": "r"},
            ],
        ),
        "messages[3]",
    ),
    "chat-duplicate-call-ids": (
        *chat(
            tools=[FN],
            messages=[
                *USER,
                {"role": "assistant", "content": None, "tool_calls": [CALL, CALL]},
                {"role": "tool", "tool_call_id": "c1", "content": "r"},
            ],
        ),
        "messages[1].tool_calls[1].id",
    ),
    "chat-call-without-type": (
        *chat(
            tools=[FN],
            messages=[
                *USER,
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c1", "function": CALL["function"]}],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "r"},
            ],
        ),
        "messages[1].tool_calls[0].type",
    ),
    "chat-tool-without-type": (*chat(tools=[{"function": {"name": "f"}}]), "tools[0].type"),
    "chat-tool-name-of-129": (
        *chat(tools=[{"type": "function", "function": {"name": "f" * 129}}]),
        "tools[0].function.name",
    ),
    "chat-assistant-image-v41": (
        *chat(
            V41,
            messages=[
                *USER,
                {"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": IMAGE_URL}}]},
                *USER,
            ],
        ),
        None,
    ),
    "chat-file-part-v41": (*chat(V41, messages=m_user({"type": "file", "file": {"file_id": "f"}})), None),
    "messages-duplicate-tool-results": (
        *msgs(
            tools=[TOOL_M],
            messages=[*USER, {"role": "assistant", "content": [TOOL_USE]}, *m_user(TOOL_RESULT, TOOL_RESULT)],
        ),
        "messages[2].content[1]",
    ),
    "messages-duplicate-tool-use-ids": (
        *msgs(
            tools=[TOOL_M],
            messages=[*USER, {"role": "assistant", "content": [TOOL_USE, TOOL_USE]}, *m_user(TOOL_RESULT)],
        ),
        "messages[1].content[1]",
    ),
    "messages-tool-result-after-text": (
        *msgs(
            tools=[TOOL_M],
            messages=[
                *USER,
                {"role": "assistant", "content": [TOOL_USE]},
                *m_user({"type": "text", "text": "x"}, TOOL_RESULT),
            ],
        ),
        "messages[2].content[1]",
    ),
    "messages-text-after-tool-use": (
        *msgs(
            tools=[TOOL_M],
            messages=[
                *USER,
                {"role": "assistant", "content": [TOOL_USE, {"type": "text", "text": "x"}]},
                *m_user(TOOL_RESULT),
            ],
        ),
        "messages[1].content[1]",
    ),
    "messages-system-role-between-use-and-result": (
        *msgs(
            tools=[TOOL_M],
            messages=[
                *USER,
                {"role": "assistant", "content": [TOOL_USE]},
                {"role": "system", "content": "s"},
                *m_user(TOOL_RESULT),
            ],
        ),
        "messages[1].content[0]",
    ),
    "messages-negative-budget": (
        *msgs(thinking={"type": "enabled", "budget_tokens": -1}),
        "thinking.budget_tokens",
    ),
    "messages-temperature-above-2": (*msgs(temperature=2.5), "temperature"),
    "messages-image-file-v41": (
        *msgs(V41, messages=m_user({"type": "image", "source": {"type": "file", "file_id": "f"}})),
        None,
    ),
    "messages-assistant-image-v41": (
        *msgs(
            V41,
            messages=[
                *USER,
                {
                    "role": "assistant",
                    "content": [{"type": "image", "source": {"type": "url", "url": IMAGE_URL}}],
                },
                *USER,
            ],
        ),
        None,
    ),
    "responses-neither-input-nor-instructions": ("responses", {"model": V4, "instructions": ""}, "input"),
    "responses-duplicate-call-id": (
        *resp(tools=[{"type": "function", "name": "f"}], input=[*USER, FC, FC_OUT, *USER, FC, FC_OUT]),
        "input[4].call_id",
    ),
    "chat-strict-nested-object-without-properties": (
        *chat(
            tools=[
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "strict": True,
                        "parameters": {"type": "object", "properties": {"o": {"type": "object"}}},
                    },
                }
            ]
        ),
        "tools[0].function.parameters",
    ),
    "chat-strict-string-enum-of-numbers": (
        *chat(
            tools=[
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "strict": True,
                        "parameters": {
                            "type": "object",
                            "properties": {"a": {"type": "string", "enum": [1]}},
                        },
                    },
                }
            ]
        ),
        "tools[0].function.parameters",
    ),
    "chat-schema-type-null": (
        *chat(
            tools=[
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {"type": "object", "properties": {"a": {"type": None}}},
                    },
                }
            ]
        ),
        "tools[0].function.parameters",
    ),
    "responses-image-by-file-id-v41": (
        *resp(V41, input=[{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]),
        None,
    ),
    "responses-assistant-image-v41": (
        *resp(
            V41,
            input=[
                *USER,
                {"role": "assistant", "content": [{"type": "input_image", "image_url": IMAGE_URL}]},
                *USER,
            ],
        ),
        None,
    ),
}


@pytest.fixture(scope="module")
def own_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_v41_tokenizer(tmp_path_factory.mktemp("v41"))


@pytest.fixture(scope="module")
def recipe(own_tokenizer: Path) -> Recipe:
    return Recipe(models=ModelTable({V41: ServedModel(V41, ModelVersion.V41, tokenizer=own_tokenizer)}))


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_accepted_as_deepseek_recipe_accepts_it(recipe: Recipe, own_tokenizer: Path, name: str) -> None:
    protocol, body = ACCEPTED[name]
    theirs = REQUESTS[protocol](body).convert(dr.ConversionOptions())
    ours = recipe.prepare(protocol, body)  # type: ignore[arg-type]
    version = version_of(theirs.model_version)
    rendered = encoding(version).render_conversation(theirs.conversation)
    assert ours.prompt.text == rendered.prompt
    assert list(ours.prompt.special_ranges) == [tuple(r) for r in rendered.special_ranges]
    enc = encoding(version) if version is ModelVersion.V4 else v41_encoding(own_tokenizer)
    assert list(ours.prompt_token_ids) == enc.encode(theirs.conversation)
    assert ours.max_tokens == theirs.resolve_max_tokens(ours.prompt_tokens, 1_048_576)
    assert ours.thinking == theirs.conversation.thinking_mode


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_as_deepseek_recipe_refuses_it(recipe: Recipe, name: str) -> None:
    protocol, body, param = REFUSED[name]
    with pytest.raises((dr.ConversionError, ValueError)):
        REQUESTS[protocol](body).convert(dr.ConversionOptions())
    with pytest.raises(RequestError) as info:
        recipe.prepare(protocol, body)  # type: ignore[arg-type]
    assert info.value.status == 400
    assert info.value.param == param, info.value


def test_the_regex_format_constrains_the_output(recipe: Recipe) -> None:
    protocol, body = ACCEPTED["chat-regex-format"]
    fmt = recipe.prepare(protocol, body).response_format  # type: ignore[arg-type]
    assert (fmt.kind, fmt.regex) == ("regex", "[a-z]+")


def test_messages_output_format_constrains_without_being_stated(recipe: Recipe) -> None:
    protocol, body = ACCEPTED["messages-output-format-object-without-properties"]
    ours = recipe.prepare(protocol, body)  # type: ignore[arg-type]
    assert ours.response_format.kind == "json_schema" and ours.response_format.schema == {"type": "object"}
    assert "Response Format" not in ours.prompt.text
