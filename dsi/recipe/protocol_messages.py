"""Anthropic Messages request body -> ParsedRequest.

Each content block becomes its own message (text, image, tool result), so that the renderer
joins them as DeepSeek's templates do. A final assistant message is a prefill: generation
continues it (the Messages specification), where deepseek-recipe would start a new turn.
``tool_choice: any`` requires a tool call (deepseek-recipe treats it as ``auto``).
"""

from __future__ import annotations

from typing import Any, Literal

from dsi.recipe import jsontext
from dsi.recipe.conversation import (
    AssistantMessage,
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
    check_range,
    check_stop,
    check_tool_mix,
    choose_tool,
    response_schema,
    tool_spec,
    unique_tools,
)
from dsi.recipe.wire import Wire, decode, fail

MIN_THINKING_BUDGET = 1024

# -- wire types ----------------------------------------------------------------------------


class CacheControl(Wire):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(Wire, tag_field="type", tag="text"):
    text: str
    cache_control: CacheControl | None = None
    citations: list[Any] | None = None


class Base64Source(Wire, tag_field="type", tag="base64"):
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str


class URLSource(Wire, tag_field="type", tag="url"):
    url: str


class ImageBlock(Wire, tag_field="type", tag="image"):
    source: Base64Source | URLSource
    cache_control: CacheControl | None = None


class ToolUseBlock(Wire, tag_field="type", tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolResultBlock(Wire, tag_field="type", tag="tool_result"):
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock] | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = None


class ThinkingBlock(Wire, tag_field="type", tag="thinking"):
    thinking: str
    signature: str


class RedactedThinkingBlock(Wire, tag_field="type", tag="redacted_thinking"):
    data: str


Block = TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock


class MessageWire(Wire):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class ToolDef(Wire):
    name: str
    input_schema: Any
    description: str | None = None
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None


class ToolChoice(Wire):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(Wire):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None


class OutputFormat(Wire):
    type: Literal["json_schema"]
    schema: Any


class OutputConfig(Wire):
    effort: EffortName | None = None
    format: OutputFormat | None = None


class Metadata(Wire):
    user_id: str | None = None
    hit_policy: str | None = None  # dsi: "bounded" | "exact" (checked by the gateway)


class MessagesRequest(Wire):
    model: str
    messages: list[MessageWire]
    max_tokens: int
    system: str | list[TextBlock] | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    thinking: Thinking | None = None
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None
    output_config: OutputConfig | None = None
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None


# -- conversion ----------------------------------------------------------------------------


def parse_messages(body: bytes | str | dict[str, Any]) -> ParsedRequest:
    req = decode(body, MessagesRequest)
    if not req.messages:
        raise fail("at least one message is required", "messages")
    messages = _system(req.system) + _messages(req.messages)
    tools = unique_tools(
        [
            tool_spec(t.name, t.description, t.input_schema, None, f"tools[{i}]")
            for i, t in enumerate(req.tools or [])
        ],
        "tools",
    )
    choice = req.tool_choice or ToolChoice("auto")
    if choice.type == "tool" and choice.name is None:
        raise fail(
            "Missing required parameter: 'tool_choice.name'.",
            "tool_choice.name",
            code="missing_required_parameter",
        )
    kind = {"auto": "auto", "none": "none", "any": "required", "tool": "named"}[choice.type]
    tool_choice, forced = choose_tool(kind, choice.name, tools, "tool_choice")
    fmt = ResponseFormat()
    if req.output_config and req.output_config.format:
        fmt = response_schema(req.output_config.format.schema, True, None, "output_config.format.schema")
    tools = check_tool_mix(tools, tool_choice, forced, fmt, "output_config.format", fmt.kind != "text")
    thinking = _thinking(req)
    return ParsedRequest(
        "messages",
        req.model,
        messages,
        tools,
        tool_choice,
        forced,
        "tool_choice",
        fmt,
        thinking,
        _options(req),
        "max_tokens",
        clamp_max_tokens=True,
    )


def _thinking(req: MessagesRequest) -> ThinkingRequest:
    effort = req.output_config.effort if req.output_config else None
    if req.thinking is None:
        return ThinkingRequest(None, effort, "output_config.effort")
    if req.thinking.type == "enabled":
        budget = req.thinking.budget_tokens
        if budget is None:
            raise fail(
                "Missing required parameter: 'thinking.budget_tokens'.",
                "thinking.budget_tokens",
                code="missing_required_parameter",
            )
        if budget < MIN_THINKING_BUDGET:
            raise fail(
                f"thinking.budget_tokens must be at least {MIN_THINKING_BUDGET}", "thinking.budget_tokens"
            )
        if budget >= req.max_tokens:
            raise fail("max_tokens must be greater than thinking.budget_tokens", "thinking.budget_tokens")
    return ThinkingRequest(req.thinking.type != "disabled", effort, "output_config.effort")


def _system(system: str | list[TextBlock] | None) -> tuple[Message, ...]:
    if system is None:
        return ()
    if isinstance(system, str):
        return (SystemMessage((system,)),)
    return (SystemMessage(("\n\n".join(b.text for b in system),)),) if system else ()


def _messages(wires: list[MessageWire]) -> tuple[Message, ...]:
    out: list[Message] = []
    open_calls: dict[str, str] = {}  # tool_use ids of the previous assistant message -> its path
    for i, w in enumerate(wires):
        param = f"messages[{i}]"
        if isinstance(w.content, list) and not w.content:
            raise fail("all messages must have non-empty content", f"{param}.content")
        blocks = [TextBlock(w.content)] if isinstance(w.content, str) else w.content
        if w.role == "assistant":
            _check_answered(open_calls)
            msg, open_calls = _assistant(blocks, param, last=i == len(wires) - 1)
            out.append(msg)
            continue
        answered = {b.tool_use_id for b in blocks if isinstance(b, ToolResultBlock)}
        for j, b in enumerate(blocks):
            if isinstance(b, ToolResultBlock) and b.tool_use_id not in open_calls:
                raise fail(
                    f"unexpected `tool_use_id` found in `tool_result` blocks: {b.tool_use_id}. Each "
                    "`tool_result` block must have a corresponding `tool_use` block in the previous "
                    "message.",
                    f"{param}.content[{j}]",
                )
            out.append(_user_block(b, f"{param}.content[{j}]"))
        _check_answered({k: v for k, v in open_calls.items() if k not in answered})
        open_calls = {}
    _check_answered(open_calls)
    return tuple(out)


def _check_answered(open_calls: dict[str, str]) -> None:
    if open_calls:
        ids = ", ".join(open_calls)
        raise fail(
            f"`tool_use` ids were found without `tool_result` blocks immediately after: {ids}. Each "
            "`tool_use` block must have a corresponding `tool_result` block in the next message.",
            next(iter(open_calls.values())),
        )


def _assistant(blocks: list[Any], param: str, last: bool) -> tuple[AssistantMessage, dict[str, str]]:
    texts, thoughts, calls, ids = [], [], [], {}
    for j, b in enumerate(blocks):
        where = f"{param}.content[{j}]"
        if isinstance(b, TextBlock):
            texts.append(b.text)
        elif isinstance(b, ThinkingBlock):
            thoughts.append(b.thinking)
        elif isinstance(b, ToolUseBlock):
            calls.append(ToolCall(b.id, b.name, jsontext.dumps(b.input)))
            ids[b.id] = where
        elif not isinstance(b, RedactedThinkingBlock):
            raise fail(f"a {b.__struct_config__.tag} block is not allowed in an assistant message", where)
    reasoning = "\n\n".join(thoughts) if thoughts else None
    return AssistantMessage("\n\n".join(texts), reasoning, tuple(calls), prefix=last), ids


def _user_block(b: Any, param: str) -> Message:
    if isinstance(b, TextBlock):
        return UserMessage((b.text,))
    if isinstance(b, ImageBlock):
        return UserMessage((_image(b),))
    if isinstance(b, ToolResultBlock):
        if b.content is None or isinstance(b.content, str):
            return ToolResult(b.tool_use_id, (b.content or "",))
        parts = tuple(_image(p) if isinstance(p, ImageBlock) else p.text for p in b.content)
        return ToolResult(b.tool_use_id, parts or ("",))
    raise fail(f"a {b.__struct_config__.tag} block is not allowed in a user message", param)


def _image(b: ImageBlock) -> ImageRef:
    src = b.source
    return ImageRef(src.url if isinstance(src, URLSource) else f"data:{src.media_type};base64,{src.data}")


def _options(req: MessagesRequest) -> SamplingOptions:
    if req.max_tokens < 1:
        raise fail("max_tokens: must be at least 1", "max_tokens")
    check_range(req.temperature, 0, 1, "temperature")
    check_range(req.top_p, 0, 1, "top_p", lo_open=True)
    if req.top_k is not None and req.top_k < 0:
        raise fail("top_k must be >= 0", "top_k")
    return SamplingOptions(
        max_tokens=req.max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        stop=check_stop(req.stop_sequences, "stop_sequences"),
        stream=bool(req.stream),
        include_usage=True,
        parallel_tool_calls=not (req.tool_choice and req.tool_choice.disable_parallel_tool_use),
        user=req.metadata.user_id if req.metadata else None,
        metadata=_metadata(req.metadata),
    )


def _metadata(meta: Metadata | None) -> dict[str, str | None] | None:
    if meta is None:
        return None
    out: dict[str, str | None] = {"user_id": meta.user_id}
    if meta.hit_policy is not None:
        out["hit_policy"] = meta.hit_policy
    return out
