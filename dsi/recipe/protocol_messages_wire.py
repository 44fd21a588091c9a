"""The Anthropic Messages request body as typed structs: an unknown field or a wrong type is a
400 naming it (see dsi.recipe.wire)."""

from __future__ import annotations

from typing import Any, Literal

from dsi.recipe.request import EffortName
from dsi.recipe.wire import Wire


class CacheControl(Wire):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(Wire, tag_field="type", tag="text"):
    text: str
    cache_control: CacheControl | None = None
    citations: list[Any] | None = None


class Base64Source(Wire, tag_field="type", tag="base64"):
    media_type: Literal["image/jpeg", "image/jpg", "image/png", "image/gif", "image/webp"]
    data: str


class URLSource(Wire, tag_field="type", tag="url"):
    url: str


class FileSource(Wire, tag_field="type", tag="file"):
    file_id: str


class ImageBlock(Wire, tag_field="type", tag="image"):
    source: Base64Source | URLSource | FileSource
    cache_control: CacheControl | None = None


class DocBase64(Wire, tag_field="type", tag="base64"):
    media_type: str
    data: str


class DocText(Wire, tag_field="type", tag="text"):
    data: str
    media_type: str | None = None


class DocContent(Wire, tag_field="type", tag="content"):
    content: str | list[TextBlock | ImageBlock]


class DocumentBlock(Wire, tag_field="type", tag="document"):
    source: DocBase64 | DocText | URLSource | DocContent | FileSource
    title: str | None = None
    context: str | None = None
    citations: dict[str, Any] | None = None
    cache_control: CacheControl | None = None


class ToolUseBlock(Wire, tag_field="type", tag="tool_use"):
    id: str
    name: str
    input: Any
    cache_control: CacheControl | None = None


class ToolResultBlock(Wire, tag_field="type", tag="tool_result"):
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock | DocumentBlock] | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = None


class ThinkingBlock(Wire, tag_field="type", tag="thinking"):
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(Wire, tag_field="type", tag="redacted_thinking"):
    data: str


Block = (
    TextBlock
    | ImageBlock
    | DocumentBlock
    | ToolUseBlock
    | ToolResultBlock
    | ThinkingBlock
    | RedactedThinkingBlock
)


class MessageWire(Wire):
    role: Literal["user", "assistant", "system"]
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
    budget_tokens: int | None = None  # accepted, not a limit: deepseek-recipe ignores it too


class OutputFormat(Wire):
    type: Literal["json_schema"]
    schema: Any


class OutputConfig(Wire):
    effort: EffortName | None = None
    format: OutputFormat | None = None


class Metadata(Wire):
    user_id: str | None = None
    hit_policy: str | None = None  # dsi: "bounded" | "exact" (checked by the gateway)
    ignore_eos: bool | None = None  # dsi: generate past EOS up to max_tokens (vLLM's ignore_eos)


class MessagesRequest(Wire):
    model: str
    messages: list[MessageWire]
    max_tokens: int | None = None
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
