"""Anthropic Messages request body -> ParsedRequest.

Each content block becomes its own message (text, image, tool result), so that the renderer
joins them as DeepSeek's templates do. A final assistant message is a prefill: generation
continues it (the Messages specification), where deepseek-recipe would start a new turn.
``tool_choice: any`` requires a tool call (deepseek-recipe treats it as ``auto``); with thinking
on, the prompt is deepseek-recipe's ``auto`` prompt and the call is required after the reasoning.

Accepted as deepseek-recipe accepts them, beyond the specification: ``system``-role messages
(wrapped in ``<system-reminder>`` in V4, system messages in V4.1), any ``thinking.budget_tokens``
and no ``max_tokens`` at all (the default applies), ``temperature`` up to 2, and document
blocks (the text ``[Unsupported document type: ...]``; their content is not read).
``output_config.format`` constrains the output without being stated in the prompt.
"""

from __future__ import annotations

from typing import Any

from dsi.recipe import jsontext
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
from dsi.recipe.protocol_messages_wire import (
    DocumentBlock,
    FileSource,
    ImageBlock,
    MessagesRequest,
    MessageWire,
    Metadata,
    OutputFormat,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolChoice,
    ToolResultBlock,
    ToolUseBlock,
    URLSource,
)
from dsi.recipe.request import (
    ParsedRequest,
    SamplingOptions,
    ThinkingRequest,
    check_range,
    check_stop,
    check_tool_mix,
    choose_tool,
    tool_spec,
    unique_tools,
)
from dsi.recipe.schema import SchemaError, check_schema
from dsi.recipe.vision import V4_IMAGE_TEXT
from dsi.recipe.wire import decode, fail

FILE_IMAGE_ERROR = "file_id is not supported. Pass the image as a base64 data url instead."


def parse_messages(body: bytes | str | dict[str, Any]) -> ParsedRequest:
    req = decode(body, MessagesRequest)
    if not req.messages:
        raise fail("at least one message is required", "messages")
    messages = _system(req.system) + _messages(req.messages)
    choice = req.tool_choice or ToolChoice("auto")
    declared = choice.type != "none"
    tools = unique_tools(
        [
            tool_spec(
                t.name, t.description, t.input_schema, None, f"tools[{i}]", declared=declared, required=True
            )
            for i, t in enumerate(req.tools or [])
        ],
        "tools",
        declared,
    )
    if choice.type == "tool" and choice.name is None:
        raise fail(
            "Missing required parameter: 'tool_choice.name'.",
            "tool_choice.name",
            code="missing_required_parameter",
        )
    kind = {"auto": "auto", "none": "none", "any": "required", "tool": "named"}[choice.type]
    tool_choice, forced = choose_tool(kind, choice.name, tools, "tool_choice")
    fmt = _format(req.output_config.format if req.output_config else None)
    tools = check_tool_mix(tools, tool_choice, forced, fmt, "output_config.format", fmt.kind != "text")
    return ParsedRequest(
        "messages",
        req.model,
        messages,
        tools,
        tool_choice,
        forced,
        "tool_choice",
        fmt,
        _thinking(req),
        _options(req),
        "max_tokens",
        clamp_max_tokens=True,
        required_after_reasoning=choice.type == "any",
    )


def _thinking(req: MessagesRequest) -> ThinkingRequest:
    effort = req.output_config.effort if req.output_config else None
    if req.thinking is None:
        return ThinkingRequest(None, effort, "output_config.effort")
    budget = req.thinking.budget_tokens
    if budget is not None and budget < 0:
        raise fail("thinking.budget_tokens must not be negative", "thinking.budget_tokens")
    return ThinkingRequest(req.thinking.type != "disabled", effort, "output_config.effort")


def _format(spec: OutputFormat | None) -> ResponseFormat:
    """``output_config.format``: the output is held to the schema; the prompt does not state it."""
    if spec is None:
        return ResponseFormat()
    try:
        check_schema(spec.schema)
    except SchemaError as exc:
        raise fail(f"Invalid json schema: {exc}", "output_config.format.schema") from None
    return ResponseFormat("json_schema", spec.schema, strict=True, in_prompt=False)


def _system(system: str | list[TextBlock] | None) -> tuple[Message, ...]:
    if system is None:
        return ()
    if isinstance(system, str):
        return (SystemMessage((system,)),)
    return (SystemMessage(("\n\n".join(b.text for b in system),)),)


def _messages(wires: list[MessageWire]) -> tuple[Message, ...]:
    out: list[Message] = []
    open_calls: dict[str, str] = {}  # tool_use ids of the previous assistant message -> its path
    for i, w in enumerate(wires):
        param = f"messages[{i}]"
        if isinstance(w.content, list) and not w.content and w.role != "system":
            raise fail("all messages must have non-empty content", f"{param}.content")
        blocks = [TextBlock(w.content)] if isinstance(w.content, str) else w.content
        if w.role == "assistant":
            _check_answered(open_calls)
            msg, open_calls = _assistant(blocks, param, last=i == len(wires) - 1)
            out.append(msg)
            continue
        if w.role == "system":
            _check_answered(open_calls)
            out.append(DeveloperMessage(_system_parts(blocks, param), reminder=True))
            open_calls = {}
            continue
        _check_answered(_unanswered(blocks, open_calls, param))
        out.extend(_user_block(b, f"{param}.content[{j}]") for j, b in enumerate(blocks))
        open_calls = {}
    _check_answered(open_calls)
    return tuple(out)


def _unanswered(blocks: list[Any], open_calls: dict[str, str], param: str) -> dict[str, str]:
    """The calls of the previous assistant message that the leading ``tool_result`` blocks of
    this user message do not answer. A result must answer one of those calls, once, and come
    before every other block."""
    answered: set[str] = set()
    leading = True
    for j, b in enumerate(blocks):
        if not isinstance(b, ToolResultBlock):
            leading = False
            continue
        where = f"{param}.content[{j}]"
        if b.tool_use_id not in open_calls:
            raise fail(
                f"unexpected `tool_use_id` found in `tool_result` blocks: {b.tool_use_id}. Each "
                "`tool_result` block must have a corresponding `tool_use` block in the previous "
                "message.",
                where,
            )
        if b.tool_use_id in answered:
            raise fail(
                "each tool_use must have a single result. Found multiple `tool_result` blocks with id: "
                f"{b.tool_use_id}",
                where,
            )
        if not leading:
            raise fail("`tool_result` blocks must come first in the content of a user message", where)
        answered.add(b.tool_use_id)
    return {k: v for k, v in open_calls.items() if k not in answered}


def _check_answered(open_calls: dict[str, str]) -> None:
    if open_calls:
        ids = ", ".join(open_calls)
        raise fail(
            f"`tool_use` ids were found without `tool_result` blocks immediately after: {ids}. Each "
            "`tool_use` block must have a corresponding `tool_result` block in the next message.",
            next(iter(open_calls.values())),
        )


def _assistant(blocks: list[Any], param: str, last: bool) -> tuple[AssistantMessage, dict[str, str]]:
    """One assistant message. Only thinking and further tool_use blocks may follow a tool_use."""
    texts, thoughts, calls, ids, image = [], [], [], {}, False
    for j, b in enumerate(blocks):
        where = f"{param}.content[{j}]"
        if ids and not isinstance(b, ToolUseBlock | ThinkingBlock | RedactedThinkingBlock):
            raise fail("only `tool_use` and thinking blocks may follow a `tool_use` block", where)
        if isinstance(b, ToolUseBlock):
            if b.id in ids:
                raise fail("`tool_use` ids must be unique", where)
            calls.append(ToolCall(b.id, b.name, jsontext.dumps(b.input)))
            ids[b.id] = where
        elif isinstance(b, ThinkingBlock):
            thoughts.append(b.thinking)
        elif isinstance(b, TextBlock | ImageBlock | DocumentBlock):
            image = image or isinstance(b, ImageBlock)
            texts.append(V4_IMAGE_TEXT if isinstance(b, ImageBlock) else _block_text(b))
        elif not isinstance(b, RedactedThinkingBlock):
            raise fail(f"`{b.__struct_config__.tag}` blocks can only be in `user` messages", where)
    reasoning = "\n\n".join(thoughts) if thoughts else None
    return AssistantMessage(_join_texts(texts), reasoning, tuple(calls), prefix=last, image=image), ids


def _join_texts(texts: list[str]) -> str:
    """Texts joined by blank lines, where a text only starts a separator once some text came
    before it (``["", "a", ""]`` -> ``"a\n\n"``), as deepseek-recipe joins them."""
    out = ""
    for text in texts:
        out = f"{out}\n\n{text}" if out else text
    return out


def _system_parts(blocks: list[Any], param: str) -> tuple[str | ImageRef, ...]:
    """A ``system``-role message: text, image and document blocks."""
    parts: list[str | ImageRef] = []
    for j, b in enumerate(blocks):
        if isinstance(b, ImageBlock):
            parts.append(_image(b, f"{param}.content[{j}]"))
        elif isinstance(b, TextBlock | DocumentBlock):
            parts.append(_block_text(b))
        else:
            raise fail(f"a {b.__struct_config__.tag} block is not allowed in a system message", param)
    return tuple(parts)


def _user_block(b: Any, param: str) -> Message:
    if isinstance(b, TextBlock | DocumentBlock):
        return UserMessage((_block_text(b),))
    if isinstance(b, ImageBlock):
        return UserMessage((_image(b, param),))
    if isinstance(b, ToolResultBlock):
        if b.content is None or isinstance(b.content, str):
            return ToolResult(b.tool_use_id, (b.content or "",))
        parts = tuple(_image(p, param) if isinstance(p, ImageBlock) else _block_text(p) for p in b.content)
        return ToolResult(b.tool_use_id, parts or ("",))
    raise fail(f"a {b.__struct_config__.tag} block is not allowed in a user message", param)


def _block_text(b: TextBlock | DocumentBlock) -> str:
    """A text block's text; a document is a placeholder naming its media type."""
    if isinstance(b, TextBlock):
        return b.text
    media_type = getattr(b.source, "media_type", None)
    return f"[Unsupported document type: {media_type or 'unknown'}]"


def _image(b: ImageBlock, param: str) -> ImageRef:
    src = b.source
    if isinstance(src, URLSource):
        return ImageRef(src.url)
    if isinstance(src, FileSource):
        return ImageRef("", source_error=f"{param}: {FILE_IMAGE_ERROR}")
    media_type = "image/jpeg" if src.media_type == "image/jpg" else src.media_type
    return ImageRef(f"data:{media_type};base64,{src.data}")


def _options(req: MessagesRequest) -> SamplingOptions:
    if req.max_tokens is not None and req.max_tokens < 1:
        raise fail("max_tokens: must be at least 1", "max_tokens")
    check_range(req.temperature, 0, 2, "temperature")
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
        ignore_eos=bool(req.metadata and req.metadata.ignore_eos),
    )


def _metadata(meta: Metadata | None) -> dict[str, str | None] | None:
    if meta is None:
        return None
    out: dict[str, str | None] = {"user_id": meta.user_id}
    if meta.hit_policy is not None:
        out["hit_policy"] = meta.hit_policy
    return out
