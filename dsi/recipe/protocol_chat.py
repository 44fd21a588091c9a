"""OpenAI Chat Completions request body -> ParsedRequest.

DeepSeek extensions accepted: ``thinking: {"type": ...}``, ``reasoning_effort: "max"``,
assistant ``reasoning_content`` and ``prefix`` (continue the last assistant message), and the
``latest_reminder`` role.
"""

from __future__ import annotations

from typing import Any, Literal

from dsi.recipe.conversation import (
    AssistantMessage,
    DeveloperMessage,
    ImageRef,
    LatestReminder,
    Message,
    ResponseFormat,
    SystemMessage,
    ToolCall,
    ToolResult,
    UserMessage,
)
from dsi.recipe.request import (
    EffortName,
    ParsedRequest,
    SamplingOptions,
    ThinkingRequest,
    check_json_word,
    check_range,
    check_seed,
    check_stop,
    check_tool_mix,
    check_tool_results,
    check_top_logprobs,
    choose_tool,
    response_schema,
    tool_spec,
    unique_tools,
)
from dsi.recipe.wire import Wire, decode, fail

# -- wire types ----------------------------------------------------------------------------


class TextPart(Wire, tag_field="type", tag="text"):
    text: str


class ImageURL(Wire):
    url: str
    detail: Literal["auto", "low", "high"] = "auto"


class ImagePart(Wire, tag_field="type", tag="image_url"):
    image_url: ImageURL


class RefusalPart(Wire, tag_field="type", tag="refusal"):
    refusal: str


class FunctionCall(Wire):
    name: str
    arguments: str


class ToolCallWire(Wire):
    id: str
    function: FunctionCall
    type: Literal["function"] = "function"


class SystemWire(Wire, tag_field="role", tag="system"):
    content: str | list[TextPart]
    name: str | None = None


class DeveloperWire(Wire, tag_field="role", tag="developer"):
    content: str | list[TextPart]
    name: str | None = None


class UserWire(Wire, tag_field="role", tag="user"):
    content: str | list[TextPart | ImagePart]
    name: str | None = None


class AssistantWire(Wire, tag_field="role", tag="assistant"):
    content: str | list[TextPart | RefusalPart] | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallWire] | None = None
    refusal: str | None = None
    name: str | None = None
    prefix: bool = False


class ToolWire(Wire, tag_field="role", tag="tool"):
    content: str | list[TextPart]
    tool_call_id: str


class ReminderWire(Wire, tag_field="role", tag="latest_reminder"):
    content: str


MessageWire = SystemWire | DeveloperWire | UserWire | AssistantWire | ToolWire | ReminderWire


class FunctionDef(Wire):
    name: str
    description: str | None = None
    parameters: Any = None
    strict: bool | None = None


class ToolDef(Wire):
    function: FunctionDef
    type: Literal["function"] = "function"


class FunctionName(Wire):
    name: str


class NamedToolChoice(Wire):
    function: FunctionName
    type: Literal["function"] = "function"


class TextFormat(Wire, tag_field="type", tag="text"):
    pass


class JsonObjectFormat(Wire, tag_field="type", tag="json_object"):
    pass


class JsonSchemaSpec(Wire):
    name: str
    schema: Any
    description: str | None = None
    strict: bool | None = None


class JsonSchemaFormat(Wire, tag_field="type", tag="json_schema"):
    json_schema: JsonSchemaSpec


class StreamOptions(Wire):
    include_usage: bool = False
    include_obfuscation: bool | None = None


class Thinking(Wire):
    type: Literal["enabled", "disabled", "adaptive"]


class ChatRequest(Wire):
    model: str
    messages: list[MessageWire]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: TextFormat | JsonObjectFormat | JsonSchemaFormat | None = None
    reasoning_effort: EffortName | None = None
    thinking: Thinking | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    modalities: list[Literal["text"]] | None = None
    store: bool | None = None
    service_tier: str | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None


# -- conversion ----------------------------------------------------------------------------


def parse_chat(body: bytes | str | dict[str, Any]) -> ParsedRequest:
    req = decode(body, ChatRequest)
    if not req.messages:
        raise fail("Empty input messages", "messages")
    if req.n is not None and req.n != 1:
        raise fail("Invalid n value (currently only n = 1 is supported)", "n")
    if req.logit_bias:
        raise fail("logit_bias is not supported", "logit_bias")
    messages = _messages(req.messages)
    prefix = isinstance(messages[-1], AssistantMessage) and messages[-1].prefix
    if req.tools and prefix:
        raise fail("Function call should not be used with prefix", "tools")
    if prefix and isinstance(req.response_format, JsonObjectFormat):
        raise fail("response_format json_object should not be used with prefix", "response_format")
    tools = unique_tools(
        [
            tool_spec(
                t.function.name,
                t.function.description,
                t.function.parameters,
                t.function.strict,
                f"tools[{i}].function",
                {},
            )
            for i, t in enumerate(req.tools or [])
        ],
        "tools",
    )
    choice = req.tool_choice or "auto"
    named = choice.function.name if isinstance(choice, NamedToolChoice) else None
    tool_choice, forced = choose_tool("named" if named else choice, named, tools, "tool_choice")  # type: ignore[arg-type]
    fmt = _response_format(req.response_format)
    tools = check_tool_mix(
        tools, tool_choice, forced, fmt, "response_format", req.response_format is not None
    )
    check_json_word(messages, fmt, "response_format")
    thinking = ThinkingRequest(
        None if req.thinking is None else req.thinking.type != "disabled",
        req.reasoning_effort,
        "reasoning_effort",
    )
    max_param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    return ParsedRequest(
        "chat",
        req.model,
        messages,
        tools,
        tool_choice,
        forced,
        "tool_choice",
        fmt,
        thinking,
        _options(req),
        max_param,
    )


def _messages(wires: list[MessageWire]) -> tuple[Message, ...]:
    out: list[tuple[Message, str]] = []
    calls: dict[int, set[str]] = {}
    for i, w in enumerate(wires):
        param = f"messages[{i}]"
        if isinstance(w, AssistantWire) and w.prefix and i != len(wires) - 1:
            raise fail(
                "Invalid completion message: prefix set true with message which is not final message "
                "or message role is not assistant",
                f"{param}.prefix",
            )
        if isinstance(w, AssistantWire) and w.prefix and w.tool_calls:
            raise fail("Function call should not be used with prefix", f"{param}.tool_calls")
        if isinstance(w, AssistantWire) and w.tool_calls:
            calls[len(out)] = {c.id for c in w.tool_calls}
        out.append((_message(w), param))
    check_tool_results(out, calls)
    return tuple(m for m, _ in out)


def _message(w: MessageWire) -> Message:
    if isinstance(w, SystemWire):
        return SystemMessage((_text(w.content),))
    if isinstance(w, DeveloperWire):
        return DeveloperMessage((_text(w.content),))
    if isinstance(w, UserWire):
        if isinstance(w.content, str):
            return UserMessage((w.content,))
        return UserMessage(
            tuple(
                p.text if isinstance(p, TextPart) else ImageRef(p.image_url.url, p.image_url.detail)
                for p in w.content
            )
        )
    if isinstance(w, AssistantWire):
        calls = tuple(ToolCall(c.id, c.function.name, c.function.arguments) for c in w.tool_calls or [])
        return AssistantMessage(_text(w.content), w.reasoning_content, calls, w.prefix)
    if isinstance(w, ToolWire):
        return ToolResult(w.tool_call_id, (_text(w.content),))
    return LatestReminder(w.content)


def _text(content: str | list[Any] | None) -> str:
    """Text parts joined by blank lines (a refusal part counts as text)."""
    if content is None or isinstance(content, str):
        return content or ""
    return "\n\n".join(p.text if isinstance(p, TextPart) else p.refusal for p in content)


def _response_format(fmt: TextFormat | JsonObjectFormat | JsonSchemaFormat | None) -> ResponseFormat:
    if isinstance(fmt, JsonObjectFormat):
        return ResponseFormat("json_object")
    if isinstance(fmt, JsonSchemaFormat):
        spec = fmt.json_schema
        return response_schema(spec.schema, spec.strict, spec.name, "response_format.json_schema.schema")
    return ResponseFormat()


def _options(req: ChatRequest) -> SamplingOptions:
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    if max_tokens is not None and max_tokens < 1:
        raise fail(f"Invalid {param} value, {param} must be at least 1", param)
    check_range(req.temperature, 0, 2, "temperature")
    check_range(req.top_p, 0, 1, "top_p", lo_open=True)
    check_range(req.frequency_penalty, -2, 2, "frequency_penalty")
    check_range(req.presence_penalty, -2, 2, "presence_penalty")
    check_seed(req.seed)
    if req.stream_options is not None and not req.stream:
        raise fail("stream_options should be set along with stream = true", "stream_options")
    logprobs = bool(req.logprobs)
    return SamplingOptions(
        max_tokens=max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        seed=req.seed,
        stop=check_stop(req.stop, "stop"),
        logprobs=logprobs,
        top_logprobs=check_top_logprobs(req.top_logprobs, logprobs),
        frequency_penalty=req.frequency_penalty or 0.0,
        presence_penalty=req.presence_penalty or 0.0,
        stream=bool(req.stream),
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        parallel_tool_calls=req.parallel_tool_calls is not False,
        user=req.user,
        metadata=req.metadata,
    )
