"""OpenAI Chat Completions request body -> ParsedRequest.

DeepSeek extensions accepted: ``thinking: {"type": ..., "budget_tokens": ...}`` (the budget is
not a limit, as in deepseek-recipe), ``reasoning_effort: "max"`` / ``"ultra"``, a ``regex``
response format, image ``detail: "original"``, assistant ``reasoning_content`` and ``prefix``
(continue the last assistant message), and the ``latest_reminder`` role. vLLM's ``ignore_eos``
(a boolean): the output runs to ``max_tokens``, past the model's EOS. As in deepseek-recipe,
an image in assistant history and a ``file`` part are the text ``[Unsupported Image]`` in V4 and
refused in V4.1, and a ``json_schema`` format needs no name.
"""

from __future__ import annotations

from typing import Any

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
from dsi.recipe.protocol_chat_wire import (
    AssistantWire,
    ChatRequest,
    DeveloperWire,
    FilePart,
    ImagePart,
    JsonObjectFormat,
    JsonSchemaFormat,
    MessageWire,
    NamedToolChoice,
    RefusalPart,
    RegexFormat,
    SystemWire,
    TextFormat,
    TextPart,
    ToolWire,
    UserWire,
)
from dsi.recipe.request import (
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
from dsi.recipe.vision import V4_IMAGE_TEXT
from dsi.recipe.wire import decode, fail

FILE_PART_ERROR = "file parts are not supported; send an image as an image_url part"


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
    declared = req.tool_choice != "none"
    tools = unique_tools(
        [
            tool_spec(
                t.function.name,
                t.function.description,
                t.function.parameters,
                t.function.strict,
                f"tools[{i}].function",
                {},
                declared=declared,
            )
            for i, t in enumerate(req.tools or [])
        ],
        "tools",
        declared,
    )
    choice = req.tool_choice or "auto"
    named = choice.function.name if isinstance(choice, NamedToolChoice) else None
    tool_choice, forced = choose_tool("named" if named else choice, named, tools, "tool_choice")  # type: ignore[arg-type]
    fmt = _response_format(req.response_format)
    tools = check_tool_mix(
        tools, tool_choice, forced, fmt, "response_format", req.response_format is not None
    )
    check_json_word(messages, fmt, "response_format")
    if req.thinking and req.thinking.budget_tokens is not None and req.thinking.budget_tokens < 0:
        raise fail("thinking.budget_tokens must not be negative", "thinking.budget_tokens")
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
        if isinstance(w, AssistantWire):
            _check_assistant(w, i)
            calls[len(out)] = {c.id for c in w.tool_calls or []}
        if isinstance(w, SystemWire) and not _text(w.content):
            continue  # deepseek-recipe leaves an empty system message out
        out.append((_message(w, param), param))
    check_tool_results(out, calls)
    return tuple(m for m, _ in out)


def _check_assistant(w: AssistantWire, index: int) -> None:
    param = f"messages[{index}]"
    if w.tool_calls is not None and not w.tool_calls:
        raise fail(
            f"Invalid '{param}.tool_calls': empty array. Expected an array with minimum length 1, but got "
            "an empty array instead.",
            f"{param}.tool_calls",
        )
    if w.content is None and not w.tool_calls:
        raise fail("Invalid assistant message: content or tool_calls must be set", f"{param}.content")
    if w.prefix and w.tool_calls:
        raise fail("Function call should not be used with prefix", f"{param}.tool_calls")
    ids = [c.id for c in w.tool_calls or []]
    for j, call_id in enumerate(ids):
        if call_id in ids[:j]:
            raise fail(
                f"Duplicate value for 'tool_call_id' of {call_id} in message[{index}]",
                f"{param}.tool_calls[{j}].id",
            )


def _message(w: MessageWire, param: str) -> Message:
    if isinstance(w, SystemWire):
        return SystemMessage((_text(w.content),))
    if isinstance(w, DeveloperWire):
        return DeveloperMessage((_text(w.content),))
    if isinstance(w, UserWire):
        return UserMessage(_parts(w.content, param))
    if isinstance(w, AssistantWire):
        calls = tuple(ToolCall(c.id, c.function.name, c.function.arguments) for c in w.tool_calls or [])
        image = isinstance(w.content, list) and any(isinstance(p, ImagePart | FilePart) for p in w.content)
        return AssistantMessage(_text(w.content), w.reasoning_content, calls, w.prefix, image)
    if isinstance(w, ToolWire):
        return ToolResult(w.tool_call_id, _parts(w.content, param))
    return LatestReminder(w.content)


def _parts(content: str | list[Any], param: str) -> tuple[str | ImageRef, ...]:
    if isinstance(content, str):
        return (content,)
    parts: list[str | ImageRef] = []
    for j, p in enumerate(content):
        if isinstance(p, ImagePart):
            parts.append(ImageRef(p.image_url.url, p.image_url.detail))
        elif isinstance(p, FilePart):
            parts.append(ImageRef("", source_error=f"{param}.content[{j}]: {FILE_PART_ERROR}"))
        else:
            parts.append(p.text)
    return tuple(parts)


def _text(content: str | list[Any] | None) -> str:
    """Text parts joined by blank lines (a refusal part counts as text, an image is V4's
    placeholder: V4.1 refuses images in assistant history)."""
    if content is None or isinstance(content, str):
        return content or ""
    return "\n\n".join(_part_text(p) for p in content)


def _part_text(p: Any) -> str:
    if isinstance(p, TextPart):
        return p.text
    if isinstance(p, RefusalPart):
        return p.refusal
    return V4_IMAGE_TEXT


def _response_format(
    fmt: TextFormat | JsonObjectFormat | JsonSchemaFormat | RegexFormat | None,
) -> ResponseFormat:
    if isinstance(fmt, JsonObjectFormat):
        return ResponseFormat("json_object")
    if isinstance(fmt, RegexFormat):
        return ResponseFormat("regex", regex=fmt.regex)
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
        ignore_eos=bool(req.ignore_eos),
        stream=bool(req.stream),
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        parallel_tool_calls=req.parallel_tool_calls is not False,
        user=req.user,
        metadata=req.metadata,
    )
