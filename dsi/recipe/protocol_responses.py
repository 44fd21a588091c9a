"""OpenAI Responses request body -> ParsedRequest.

``instructions`` becomes the first system message; ``developer`` input messages stay developer
messages (V4 renders them as user turns, V4.1 as system messages); reasoning items, assistant messages and function calls
that follow each other form one assistant turn. Stored state (``previous_response_id``,
``conversation``) is not supported; ``web_search`` tools are dropped (not executed here).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from dsi.recipe.conversation import (
    AssistantMessage,
    DeveloperMessage,
    ImageRef,
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
    check_tool_mix,
    check_top_logprobs,
    choose_tool,
    response_schema,
    tool_spec,
    unique_tools,
)
from dsi.recipe.wire import Wire, decode, fail

DROPPED_TOOL_TYPES = frozenset({"web_search", "web_search_preview"})

# -- wire types ----------------------------------------------------------------------------


class InputText(Wire, tag_field="type", tag="input_text"):
    text: str


class OutputText(Wire, tag_field="type", tag="output_text"):
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class Refusal(Wire, tag_field="type", tag="refusal"):
    refusal: str


class InputImage(Wire, tag_field="type", tag="input_image"):
    image_url: str | None = None
    file_id: str | None = None
    detail: Literal["auto", "low", "high"] = "auto"


ContentPart = InputText | OutputText | Refusal | InputImage


class MessageItem(Wire, tag_field="type", tag="message"):
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]
    id: str | None = None
    status: str | None = None


class FunctionCallItem(Wire, tag_field="type", tag="function_call"):
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(Wire, tag_field="type", tag="function_call_output"):
    call_id: str
    output: str | list[InputText | InputImage]
    id: str | None = None
    status: str | None = None


class SummaryText(Wire, tag_field="type", tag="summary_text"):
    text: str


class ReasoningText(Wire, tag_field="type", tag="reasoning_text"):
    text: str


class ReasoningItem(Wire, tag_field="type", tag="reasoning"):
    summary: list[SummaryText]
    id: str | None = None
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: str | None = None


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem


class FunctionTool(Wire):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: Any = None
    strict: bool | None = None


class NamedToolChoice(Wire):
    type: Literal["function"]
    name: str


class TextFormatSpec(Wire):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema: Any = None
    description: str | None = None
    strict: bool | None = None


class TextConfig(Wire):
    format: TextFormatSpec | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class Reasoning(Wire):
    effort: EffortName | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class StreamOptions(Wire):
    include_obfuscation: bool | None = None


class ResponsesRequest(Wire):
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = None
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    include: list[str] | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    store: bool | None = None
    background: bool | None = None
    previous_response_id: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None


# -- conversion ----------------------------------------------------------------------------


def parse_responses(body: bytes | str | dict[str, Any]) -> ParsedRequest:
    req = decode(body, ResponsesRequest)
    if req.previous_response_id is not None:
        raise fail(
            "previous_response_id is not supported: send the whole conversation as input",
            "previous_response_id",
        )
    if req.background:
        raise fail("background responses are not supported", "background")
    messages = _messages(req)
    tools = unique_tools(
        [
            tool_spec(t.name or "", t.description, t.parameters, t.strict, f"tools[{i}]", {})
            for i, t in enumerate(req.tools or [])
            if _function_tool(t, i)
        ],
        "tools",
    )
    choice = req.tool_choice or "auto"
    named = choice.name if isinstance(choice, NamedToolChoice) else None
    tool_choice, forced = choose_tool("named" if named else choice, named, tools, "tool_choice")  # type: ignore[arg-type]
    fmt = _format(req.text.format if req.text else None)
    tools = check_tool_mix(tools, tool_choice, forced, fmt, "text.format", fmt.kind != "text")
    check_json_word(messages, fmt, "text.format")
    effort = req.reasoning.effort if req.reasoning else None
    echo = {
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "user": req.user,
        "reasoning": {"effort": effort, "summary": req.reasoning.summary if req.reasoning else None},
        "text": {"format": {"type": fmt.kind}},
        "truncation": req.truncation or "disabled",
        "store": req.store,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "max_tool_calls": req.max_tool_calls,
        "top_logprobs": req.top_logprobs or 0,
    }
    return ParsedRequest(
        "responses",
        req.model,
        messages,
        tools,
        tool_choice,
        forced,
        "tool_choice",
        fmt,
        ThinkingRequest(None, effort, "reasoning.effort"),
        _options(req),
        "max_output_tokens",
        echo=echo,
    )


def _function_tool(tool: FunctionTool, i: int) -> bool:
    if tool.type in DROPPED_TOOL_TYPES:
        return False
    if tool.type != "function":
        raise fail(f"Tool type '{tool.type}' is not supported; only function tools are.", f"tools[{i}].type")
    if tool.name is None:
        raise fail(
            "Missing required parameter: 'name'.", f"tools[{i}].name", code="missing_required_parameter"
        )
    return True


def _messages(req: ResponsesRequest) -> tuple[Message, ...]:
    out: list[Message] = [SystemMessage((req.instructions,))] if req.instructions is not None else []
    if isinstance(req.input, str):
        return (*out, UserMessage((req.input,)))
    if not req.input:
        raise fail("Input items array must not be empty", "input")
    turn: _AssistantTurn | None = None
    pending: dict[str, str] = {}  # call id -> path of a function call still waiting for its output
    for i, raw in enumerate(req.input):
        param = f"input[{i}]"
        item = _item(raw, param)
        if pending and not isinstance(item, FunctionCallItem | FunctionCallOutputItem):
            _missing_output(pending)
        if isinstance(item, FunctionCallOutputItem):
            if item.call_id not in pending:
                raise fail(
                    f"No tool call found for tool output with call_id {item.call_id}.", f"{param}.call_id"
                )
            del pending[item.call_id]
            out.append(ToolResult(item.call_id, _parts(item.output, param)))
            turn = None
        elif isinstance(item, ReasoningItem | FunctionCallItem) or item.role == "assistant":
            if turn is None:
                turn = _AssistantTurn(len(out))
                out.append(turn.message())
            out[turn.index] = turn.add(item)
            if isinstance(item, FunctionCallItem):
                pending[item.call_id] = param
        else:
            turn = None
            parts = _parts(item.content, param)
            kind = {"system": SystemMessage, "developer": DeveloperMessage}.get(item.role, UserMessage)
            out.append(kind(parts))
    if pending:
        _missing_output(pending)
    return tuple(out)


def _missing_output(pending: dict[str, str]) -> None:
    call_id, where = next(iter(pending.items()))
    raise fail(f"No tool output found for function call {call_id}.", where)


class _AssistantTurn:
    """Reasoning items, assistant messages and function calls in a row: one assistant message."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[ToolCall] = []

    def add(self, item: MessageItem | FunctionCallItem | ReasoningItem) -> Message:
        if isinstance(item, ReasoningItem):
            self.reasoning.extend(t.text for t in item.content or [])
        elif isinstance(item, FunctionCallItem):
            self.calls.append(ToolCall(item.call_id, item.name, item.arguments))
        else:
            self.content.append(_text(item.content))
        return self.message()

    def message(self) -> AssistantMessage:
        reasoning = "\n".join(self.reasoning) if self.reasoning else None
        calls = sorted(self.calls, key=lambda c: c.id)  # DeepSeek orders a turn's calls by id
        return AssistantMessage("\n\n".join(self.content), reasoning, tuple(calls))


def _item(raw: dict[str, Any], param: str) -> Any:
    if "type" not in raw and "role" in raw:  # an EasyInputMessage
        raw = {"type": "message", **raw}
    try:
        return msgspec.convert(raw, InputItem)
    except msgspec.ValidationError as exc:
        message, _, where = str(exc).partition(" - at `")
        path = where.rstrip("`").removeprefix("$")
        raise fail(f"Invalid input item: {message}", f"{param}{path}") from None


def _parts(content: str | list[Any], param: str) -> tuple[str | ImageRef, ...]:
    if isinstance(content, str):
        return (content,)
    parts: list[str | ImageRef] = []
    for j, p in enumerate(content):
        if isinstance(p, InputImage):
            if p.image_url is None:
                raise fail(
                    "input_image needs an image_url (file_id is not supported)", f"{param}.content[{j}]"
                )
            parts.append(ImageRef(p.image_url, p.detail))
        else:
            parts.append(p.refusal if isinstance(p, Refusal) else p.text)
    return tuple(parts)


def _text(content: str | list[Any]) -> str:
    if isinstance(content, str):
        return content
    return "\n\n".join(p.refusal if isinstance(p, Refusal) else getattr(p, "text", "") for p in content)


def _format(spec: TextFormatSpec | None) -> ResponseFormat:
    if spec is None or spec.type == "text":
        return ResponseFormat()
    if spec.type == "json_object":
        return ResponseFormat("json_object")
    if spec.name is None:
        raise fail(
            "Missing required parameter: 'text.format.name'.",
            "text.format.name",
            code="missing_required_parameter",
        )
    if spec.schema is None:
        raise fail(
            "Missing required parameter: 'text.format.schema'.",
            "text.format.schema",
            code="missing_required_parameter",
        )
    return response_schema(spec.schema, spec.strict, spec.name, "text.format.schema")


def _options(req: ResponsesRequest) -> SamplingOptions:
    if req.max_output_tokens is not None and req.max_output_tokens < 1:
        raise fail(
            "Invalid max_output_tokens value, max_output_tokens must be at least 1", "max_output_tokens"
        )
    check_range(req.temperature, 0, 2, "temperature")
    check_range(req.top_p, 0, 1, "top_p", lo_open=True)
    if req.stream_options is not None and not req.stream:
        raise fail("stream_options should be set along with stream = true", "stream_options")
    logprobs = req.top_logprobs is not None or "message.output_text.logprobs" in (req.include or [])
    return SamplingOptions(
        max_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        logprobs=logprobs,
        top_logprobs=check_top_logprobs(req.top_logprobs, logprobs),
        stream=bool(req.stream),
        include_usage=True,
        parallel_tool_calls=req.parallel_tool_calls is not False,
        user=req.user,
        metadata=req.metadata,
    )
