"""Malformed requests: each gets the right HTTP status and an error body in its protocol's
shape, naming the offending parameter where there is one."""

from __future__ import annotations

from typing import Any

import pytest

from dsi.recipe import ModelVersion, Recipe, RequestError, ServedModel, error_body
from dsi.recipe.models import ModelTable

V4 = "DeepSeek-V4-Pro"
USER = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": V4, "messages": USER, **fields}


def resp(**fields: Any) -> dict[str, Any]:
    return {"model": V4, "input": "hi", **fields}


def msgs(**fields: Any) -> dict[str, Any]:
    return {"model": V4, "max_tokens": 64, "messages": USER, **fields}


def without(body: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != key}


# (protocol, body, status, param or None)
CASES: dict[str, tuple[str, Any, int, str | None]] = {
    "chat-invalid-json": ("chat", b'{"model": ', 400, None),
    "chat-invalid-utf8": ("chat", b'{"model": "\xff\xfe", "messages": []}', 400, None),
    "chat-not-an-object": ("chat", b"[1, 2]", 400, None),
    "chat-missing-model": ("chat", without(chat(), "model"), 400, "model"),
    "chat-model-wrong-type": ("chat", chat(model=7), 400, "model"),
    "chat-missing-messages": ("chat", without(chat(), "messages"), 400, "messages"),
    "chat-empty-messages": ("chat", chat(messages=[]), 400, "messages"),
    "chat-unknown-role": (
        "chat",
        chat(messages=[{"role": "robot", "content": "x"}]),
        400,
        "messages[0].role",
    ),
    "chat-content-wrong-type": (
        "chat",
        chat(messages=[{"role": "user", "content": 5}]),
        400,
        "messages[0].content",
    ),
    "chat-unknown-part": (
        "chat",
        chat(messages=[{"role": "user", "content": [{"type": "input_audio"}]}]),
        400,
        "messages[0].content[0].type",
    ),
    "chat-bad-image-detail": (
        "chat",
        chat(
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "ultra"}}
                    ],
                }
            ]
        ),
        400,
        "messages[0].content[0].image_url.detail",
    ),
    "chat-unknown-model": ("chat", chat(model="gpt-4o"), 404, "model"),
    "chat-n-2": ("chat", chat(n=2), 400, "n"),
    "chat-negative-max-tokens": ("chat", chat(max_tokens=-1), 400, "max_tokens"),
    "chat-zero-max-completion-tokens": ("chat", chat(max_completion_tokens=0), 400, "max_completion_tokens"),
    "chat-huge-max-tokens": ("chat", chat(max_tokens=10**7), 400, "max_tokens"),
    "chat-max-tokens-float": ("chat", chat(max_tokens=1.5), 400, "max_tokens"),
    "chat-temperature-3": ("chat", chat(temperature=3), 400, "temperature"),
    "chat-top-p-0": ("chat", chat(top_p=0), 400, "top_p"),
    "chat-unknown-parameter": ("chat", chat(foo=1), 400, "foo"),
    "chat-tool-without-call": (
        "chat",
        chat(messages=[*USER, {"role": "tool", "tool_call_id": "c1", "content": "r"}]),
        400,
        "messages[1]",
    ),
    "chat-tool-id-mismatch": (
        "chat",
        chat(
            tools=[TOOL],
            messages=[
                *USER,
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "zz", "content": "r"},
            ],
        ),
        400,
        "messages[2]",
    ),
    "chat-tool-schema-not-object": (
        "chat",
        chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]),
        400,
        "tools[0].function.parameters",
    ),
    "chat-tool-schema-bad-properties": (
        "chat",
        chat(
            tools=[
                {
                    "type": "function",
                    "function": {"name": "f", "parameters": {"type": "object", "properties": [1]}},
                }
            ]
        ),
        400,
        "tools[0].function.parameters",
    ),
    "chat-tool-schema-bad-type-name": (
        "chat",
        chat(
            tools=[
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {"type": "object", "properties": {"a": {"type": "strin"}}},
                    },
                }
            ]
        ),
        400,
        "tools[0].function.parameters",
    ),
    "chat-tool-bad-name": (
        "chat",
        chat(tools=[{"type": "function", "function": {"name": "a b"}}]),
        400,
        "tools[0].function.name",
    ),
    "chat-tool-duplicate-names": ("chat", chat(tools=[TOOL, TOOL]), 400, "tools[1].name"),
    "chat-tool-strict-required-mismatch": (
        "chat",
        chat(
            tools=[
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "strict": True,
                        "parameters": {
                            "type": "object",
                            "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
                            "required": ["a"],
                        },
                    },
                }
            ]
        ),
        400,
        "tools[0].function.parameters",
    ),
    "chat-tool-choice-unknown-name": (
        "chat",
        chat(
            tools=[TOOL],
            thinking={"type": "disabled"},
            tool_choice={"type": "function", "function": {"name": "g"}},
        ),
        400,
        "tool_choice",
    ),
    "chat-tool-choice-required-thinking": (
        "chat",
        chat(tools=[TOOL], tool_choice="required"),
        400,
        "tool_choice",
    ),
    "chat-json-object-without-json": (
        "chat",
        chat(response_format={"type": "json_object"}),
        400,
        "response_format",
    ),
    "chat-json-schema-missing-schema": (
        "chat",
        chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
        400,
        "response_format.json_schema.schema",
    ),
    "chat-top-logprobs-without-logprobs": ("chat", chat(top_logprobs=3), 400, "top_logprobs"),
    "chat-top-logprobs-21": ("chat", chat(logprobs=True, top_logprobs=21), 400, "top_logprobs"),
    "chat-stream-options-without-stream": (
        "chat",
        chat(stream_options={"include_usage": True}),
        400,
        "stream_options",
    ),
    "chat-too-many-stops": ("chat", chat(stop=[str(i) for i in range(17)]), 400, "stop"),
    "chat-empty-stop": ("chat", chat(stop=[""]), 400, "stop[0]"),
    "chat-negative-seed": ("chat", chat(seed=-1), 400, "seed"),
    "chat-frequency-penalty-2.5": ("chat", chat(frequency_penalty=2.5), 400, "frequency_penalty"),
    "chat-presence-penalty--3": ("chat", chat(presence_penalty=-3), 400, "presence_penalty"),
    "chat-unknown-effort": ("chat", chat(reasoning_effort="extreme"), 400, "reasoning_effort"),
    "chat-prefix-not-last": (
        "chat",
        chat(messages=[*USER, {"role": "assistant", "content": "a", "prefix": True}, *USER]),
        400,
        "messages[1].prefix",
    ),
    "chat-logit-bias": ("chat", chat(logit_bias={"42": 5}), 400, "logit_bias"),
    "chat-ignore-eos-not-a-boolean": ("chat", chat(ignore_eos="yes"), 400, "ignore_eos"),
    "responses-ignore-eos-not-a-boolean": ("responses", resp(ignore_eos=1), 400, "ignore_eos"),
    "messages-ignore-eos-not-a-boolean": (
        "messages",
        msgs(metadata={"ignore_eos": "true"}),
        400,
        "metadata.ignore_eos",
    ),
    "responses-missing-input": ("responses", without(resp(), "input"), 400, "input"),
    "responses-empty-input": ("responses", resp(input=[]), 400, "input"),
    "responses-previous-response-id": (
        "responses",
        resp(previous_response_id="resp_1"),
        400,
        "previous_response_id",
    ),
    "responses-output-without-call": (
        "responses",
        resp(input=[{"type": "function_call_output", "call_id": "c1", "output": "r"}]),
        400,
        "input[0].call_id",
    ),
    "responses-call-without-output": (
        "responses",
        resp(
            tools=[{"type": "function", "name": "f"}],
            input=[
                {"role": "user", "content": "q"},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            ],
        ),
        400,
        "input[1]",
    ),
    "responses-unknown-item": (
        "responses",
        resp(input=[{"type": "item_reference", "id": "x"}]),
        400,
        "input[0].type",
    ),
    "responses-unsupported-tool": ("responses", resp(tools=[{"type": "file_search"}]), 400, "tools[0].type"),
    "responses-bad-effort": ("responses", resp(reasoning={"effort": "extreme"}), 400, "reasoning.effort"),
    "responses-n": ("responses", resp(n=2), 400, "n"),
    "responses-schema-without-name": (
        "responses",
        resp(text={"format": {"type": "json_schema", "schema": {"type": "object"}}}),
        400,
        "text.format.name",
    ),
    "messages-invalid-json": ("messages", b"{", 400, None),
    "messages-negative-max-tokens": ("messages", msgs(max_tokens=-5), 400, "max_tokens"),
    "messages-unknown-role": (
        "messages",
        msgs(messages=[{"role": "tool", "content": "s"}, *USER]),
        400,
        "messages[0].role",
    ),
    "messages-temperature-2.5": ("messages", msgs(temperature=2.5), 400, "temperature"),
    "messages-top-k-negative": ("messages", msgs(top_k=-1), 400, "top_k"),
    # Messages has no logprobs: refused, never accepted and ignored.
    "messages-logprobs": ("messages", msgs(logprobs=True), 400, "logprobs"),
    "messages-top-logprobs": ("messages", msgs(top_logprobs=2), 400, "top_logprobs"),
    "messages-empty-content": (
        "messages",
        msgs(messages=[{"role": "user", "content": []}]),
        400,
        "messages[0].content",
    ),
    "messages-tool-use-without-result": (
        "messages",
        msgs(
            tools=[{"name": "f", "input_schema": {"type": "object"}}],
            messages=[
                *USER,
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
                },
                *USER,
            ],
        ),
        400,
        "messages[1].content[0]",
    ),
    "messages-unknown-tool-result": (
        "messages",
        msgs(
            messages=[
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t9", "content": "r"}]}
            ]
        ),
        400,
        "messages[0].content[0]",
    ),
    "messages-thinking-budget-negative": (
        "messages",
        msgs(max_tokens=4096, thinking={"type": "enabled", "budget_tokens": -1}),
        400,
        "thinking.budget_tokens",
    ),
    "messages-tool-choice-tool-thinking": (
        "messages",
        msgs(
            tools=[{"name": "f", "input_schema": {"type": "object"}}],
            tool_choice={"type": "tool", "name": "f"},
        ),
        400,
        "tool_choice",
    ),
    "messages-input-schema-not-object": (
        "messages",
        msgs(tools=[{"name": "f", "input_schema": {"type": "array"}}]),
        400,
        "tools[0].parameters",
    ),
    "messages-search-result-block": (
        "messages",
        msgs(
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "search_result", "source": "s", "title": "t", "content": []}],
                }
            ]
        ),
        400,
        "messages[0].content[0].type",
    ),
    "messages-unknown-model": ("messages", msgs(model="claude-opus-4"), 404, "model"),
}


@pytest.fixture(scope="module")
def recipe() -> Recipe:
    return Recipe({"dsi-tiny": ModelVersion.V4})


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_request(recipe: Recipe, name: str) -> None:
    protocol, body, status, param = CASES[name]
    with pytest.raises(RequestError) as info:
        recipe.prepare(protocol, body)  # type: ignore[arg-type]
    err = info.value
    assert err.status == status, err
    if param is not None:
        assert err.param == param, err
    _check_shape(err, protocol, status)


def _check_shape(err: RequestError, protocol: str, status: int) -> None:
    body = error_body(err, protocol)  # type: ignore[arg-type]
    if protocol == "messages":
        assert set(body) == {"type", "error"} and body["type"] == "error"
        assert set(body["error"]) == {"type", "message"}
        assert body["error"]["type"] == {400: "invalid_request_error", 404: "not_found_error"}[status]
        assert body["error"]["message"]
        if err.param:  # Anthropic names the location first: "messages.0.role: ..."
            assert body["error"]["message"].startswith(err.param.replace("[", ".").replace("]", "") + ": ")
    else:
        assert set(body) == {"error"}
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert body["error"]["type"] == "invalid_request_error" and body["error"]["message"]
        assert body["error"]["param"] == err.param
        assert isinstance(body["error"]["code"], str)
        if status == 404:
            assert body["error"]["code"] == "model_not_found"


def test_enough_cases() -> None:
    assert len(CASES) >= 30
    assert {p for p, *_ in CASES.values()} == {"chat", "responses", "messages"}


def test_prompt_longer_than_the_context() -> None:
    tiny = Recipe(
        models=ModelTable({"dsi-tiny": ServedModel("dsi-tiny", ModelVersion.V4, 64)}, official=False)
    )
    long_body = {"model": "dsi-tiny", "messages": [{"role": "user", "content": "word " * 200}]}
    with pytest.raises(RequestError) as info:
        tiny.prepare("chat", long_body)
    assert info.value.status == 400 and info.value.api_code == "context_length_exceeded"
    with pytest.raises(RequestError):
        tiny.prepare("chat", {**long_body, "messages": USER, "max_tokens": 60})
    ok = tiny.prepare("chat", {**long_body, "messages": USER, "thinking": {"type": "disabled"}})
    assert ok.max_tokens == 64 - ok.prompt_tokens  # the default, lowered to the room left


def _sdk_error(client: Any, status: int, body: dict[str, Any], url: str) -> Any:
    import httpx2

    response = httpx2.Response(status, json=body, request=httpx2.Request("POST", url))
    return client._make_status_error_from_response(response)


def test_sdks_read_the_error_bodies(recipe: Recipe) -> None:
    import anthropic
    import openai

    with pytest.raises(RequestError) as info:
        recipe.prepare("chat", chat(n=3))
    exc = _sdk_error(
        openai.OpenAI(api_key="k", base_url="http://x/v1"),
        400,
        error_body(info.value, "chat"),
        "http://x/v1/chat/completions",
    )
    assert isinstance(exc, openai.BadRequestError)
    assert (exc.param, exc.code, exc.type) == ("n", "invalid_value", "invalid_request_error")

    with pytest.raises(RequestError) as info:
        recipe.prepare("messages", msgs(model="nope"))
    exc = _sdk_error(
        anthropic.Anthropic(api_key="k", base_url="http://x"),
        404,
        error_body(info.value, "messages"),
        "http://x/v1/messages",
    )
    assert isinstance(exc, anthropic.NotFoundError)
    assert exc.body["error"]["type"] == "not_found_error"  # type: ignore[index]
