"""OpenAI Responses request body -> ParsedRequest.

``instructions`` becomes the first system message; ``developer`` input messages stay developer
messages (V4 renders them as user turns, V4.1 as system messages). Reasoning items, assistant
messages and function calls that follow each other form one assistant turn, as deepseek-recipe
groups them (see :class:`_AssistantTurn`). Stored state (``previous_response_id``,
``conversation``, ``item_reference``) is not supported; ``web_search`` tools, tool choices and
calls are dropped (not executed here). As in deepseek-recipe, ``input_file`` parts are the text
``[Unsupported Document]``, and an image in assistant history or one given by ``file_id`` is
``[Unsupported Image]`` in V4 and refused in V4.1.
"""

from __future__ import annotations

from typing import Any

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
from dsi.recipe.protocol_responses_wire import (
    DatedWebSearchChoice,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    InputFile,
    InputImage,
    InputItem,
    MessageItem,
    NamedToolChoice,
    ReasoningItem,
    Refusal,
    ResponsesRequest,
    TextFormatSpec,
    WebSearchCallItem,
    WebSearchChoice,
)
from dsi.recipe.request import (
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
from dsi.recipe.vision import V4_IMAGE_TEXT
from dsi.recipe.wire import decode, fail

DROPPED_TOOL_TYPES = frozenset({"web_search", "web_search_preview", "web_search_2025_08_26"})
DROPPED_CHOICE_TYPES = ("web_search", "web_search_2025_08_26")
FILE_TEXT = "[Unsupported Document]"


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
    declared = req.tool_choice != "none"
    tools = unique_tools(
        [
            tool_spec(
                t.name or "", t.description, t.parameters, t.strict, f"tools[{i}]", {}, declared=declared
            )
            for i, t in enumerate(req.tools or [])
            if _function_tool(t, i)
        ],
        "tools",
        declared,
    )
    hosted = isinstance(req.tool_choice, WebSearchChoice | DatedWebSearchChoice)
    choice = "auto" if hosted else req.tool_choice or "auto"
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
    out: list[Message] = [SystemMessage((req.instructions,))] if req.instructions else []
    if req.input is None:
        if not out:
            raise fail("Either input or instructions must be provided", "input")
        return tuple(out)
    if isinstance(req.input, str):
        return (*out, UserMessage((req.input,)))
    if not req.input:
        raise fail("Input items array must not be empty", "input")
    turn: _AssistantTurn | None = None
    pending: dict[str, str] = {}  # call id -> path of a function call still waiting for its output
    called: set[str] = set()  # every call id so far: one call per id in the whole input
    for i, raw in enumerate(req.input):
        param = f"input[{i}]"
        item = _item(raw, param)
        if pending and not isinstance(item, FunctionCallItem | FunctionCallOutputItem):
            _missing_output(pending)
        if isinstance(item, WebSearchCallItem):
            continue
        if isinstance(item, FunctionCallOutputItem):
            if item.call_id not in pending:
                raise fail(
                    f"No tool call found for tool output with call_id {item.call_id}.", f"{param}.call_id"
                )
            del pending[item.call_id]
            out.append(ToolResult(item.call_id, _parts(item.output, param)))
            turn = None
        elif isinstance(item, ReasoningItem | FunctionCallItem) or item.role == "assistant":
            if _starts_turn(turn, item):
                turn = _AssistantTurn(len(out))
                out.append(turn.message())
            if turn is not None:
                out[turn.index] = turn.add(item, param)
            if isinstance(item, FunctionCallItem):
                if item.call_id in called:
                    raise fail(f"Duplicate 'call_id': {item.call_id}.", f"{param}.call_id")
                called.add(item.call_id)
                pending[item.call_id] = param
        else:
            turn = None
            parts = _parts(item.content, param)
            kind = {"system": SystemMessage, "developer": DeveloperMessage}.get(item.role, UserMessage)
            out.append(kind(parts))
    if pending:
        _missing_output(pending)
    return tuple(out)


def _starts_turn(turn: _AssistantTurn | None, item: MessageItem | FunctionCallItem | ReasoningItem) -> bool:
    """A reasoning item with text opens an assistant turn after one that has content already; an
    empty reasoning item never opens one."""
    if isinstance(item, ReasoningItem):
        return bool(_reasoning_text(item)) and (turn is None or any(turn.content))
    return turn is None


def _missing_output(pending: dict[str, str]) -> None:
    call_id, where = next(iter(pending.items()))
    raise fail(f"No tool output found for function call {call_id}.", where)


class _AssistantTurn:
    """Reasoning items, assistant messages and function calls in a row: one assistant message.
    Its content is the messages' non-empty texts joined by blank lines; its reasoning, the
    reasoning items' non-empty texts joined by newlines."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[ToolCall] = []
        self.image = False

    def add(self, item: MessageItem | FunctionCallItem | ReasoningItem, param: str) -> Message:
        if isinstance(item, ReasoningItem):
            text = _reasoning_text(item)
            if text:
                self.reasoning.append(text)
        elif isinstance(item, FunctionCallItem):
            self.calls.append(ToolCall(item.call_id, item.name, item.arguments))
        else:
            self.content.append(_text(item.content))
            self.image = self.image or _has_image(item.content)
        return self.message()

    def message(self) -> AssistantMessage:
        reasoning = "\n".join(self.reasoning) if self.reasoning else None
        calls = sorted(self.calls, key=lambda c: c.id)  # DeepSeek orders a turn's calls by id
        content = "\n\n".join(t for t in self.content if t)
        return AssistantMessage(content, reasoning, tuple(calls), image=self.image)


def _reasoning_text(item: ReasoningItem) -> str:
    return "\n".join(t.text for t in item.content or [])


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
            parts.append(_image(p, f"{param}.content[{j}]"))
        else:
            parts.append(_part_text(p))
    return tuple(parts)


def _image(p: InputImage, param: str) -> ImageRef:
    if p.image_url is not None and p.file_id is not None:
        return ImageRef("", p.detail, f"{param}: input_image cannot have both image_url and file_id")
    if p.image_url is not None:
        return ImageRef(p.image_url, p.detail)
    if p.file_id is not None:
        return ImageRef(
            "", p.detail, f"{param}: file_id is not supported. Pass the image as a base64 data url instead."
        )
    return ImageRef("", p.detail, f"{param}: input_image must have image_url or file_id")


def _text(content: str | list[Any]) -> str:
    """An assistant message's text: parts joined by blank lines (an image is V4's placeholder)."""
    if isinstance(content, str):
        return content
    return "\n\n".join(V4_IMAGE_TEXT if isinstance(p, InputImage) else _part_text(p) for p in content)


def _part_text(p: Any) -> str:
    if isinstance(p, Refusal):
        return p.refusal
    if isinstance(p, InputFile):
        return FILE_TEXT
    return p.text


def _has_image(content: str | list[Any]) -> bool:
    return not isinstance(content, str) and any(isinstance(p, InputImage) for p in content)


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
        ignore_eos=bool(req.ignore_eos),
    )
