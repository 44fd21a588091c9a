"""Preparer: what accepted recipe parameters become for the engine (the output constraint) and
that V4.1 requests get ids from the model's vocabulary or a 400 naming the missing token."""

from __future__ import annotations

import json

import pytest

from dsi.recipe import ModelVersion, Recipe, RequestError
from dsi.roles.entrypoint.prepare import Preparer
from dsi.structured.spec import StructuredSpec

USER = [{"role": "user", "content": "hi"}]
TOOLS = [{"name": "f", "input_schema": {"type": "object", "properties": {"a": {"type": "string"}}}}]


@pytest.fixture(scope="module")
def prepare() -> Preparer:
    return Preparer(Recipe({"dsi-tiny": ModelVersion.V4}), 16_384)


def run(prepare: Preparer, protocol: str, body: dict) -> object:
    return prepare(protocol, json.dumps(body).encode(), "chatbot")


def test_a_regex_format_constrains_the_output(prepare: Preparer) -> None:
    body = {"model": "dsi-tiny", "messages": USER, "response_format": {"type": "regex", "regex": "(yes|no)"}}
    spec = run(prepare, "chat", body).sampling.structured  # type: ignore[attr-defined]
    assert spec == StructuredSpec.for_regex("(yes|no)", after_think=True)


def test_messages_output_format_constrains_the_output(prepare: Preparer) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    body = {
        "model": "dsi-tiny",
        "max_tokens": 64,
        "messages": USER,
        "thinking": {"type": "disabled"},
        "output_config": {"format": {"type": "json_schema", "schema": schema}},
    }
    spec = run(prepare, "messages", body).sampling.structured  # type: ignore[attr-defined]
    assert spec == StructuredSpec.json_schema(schema)


def test_messages_any_with_thinking_requires_a_call_after_the_reasoning(prepare: Preparer) -> None:
    body = {
        "model": "dsi-tiny",
        "max_tokens": 64,
        "messages": USER,
        "tools": TOOLS,
        "tool_choice": {"type": "any"},
        "thinking": {"type": "enabled", "budget_tokens": 64},
    }
    prepared = run(prepare, "messages", body)
    spec = prepared.sampling.structured  # type: ignore[attr-defined]
    assert spec.kind == "tool_call" and spec.tool_choice == "required"
    assert spec.after_think and not spec.opener_in_prompt
    assert prepared.options.starts_in_reasoning  # type: ignore[attr-defined]


def test_v41_ids_come_from_the_vocabulary_or_a_400_names_the_token(prepare: Preparer) -> None:
    plain = {"model": "DeepSeek-V4.1-Flash", "messages": USER, "thinking": {"type": "disabled"}}
    assert run(prepare, "chat", plain).token_ids[:2] == [0, 128803]  # type: ignore[attr-defined]
    with pytest.raises(RequestError) as info:
        run(prepare, "chat", {**plain, "thinking": {"type": "enabled"}})
    assert info.value.status == 400 and "<｜System｜>" in info.value.message
