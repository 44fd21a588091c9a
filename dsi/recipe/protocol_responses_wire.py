"""The OpenAI Responses request body as typed structs: an unknown field or a wrong type is a
400 naming it (see dsi.recipe.wire). Input items are decoded one by one (``InputItem``), so an
error names the item."""

from __future__ import annotations

from typing import Any, Literal

from dsi.recipe.request import EffortName
from dsi.recipe.wire import Wire


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
    detail: Literal["auto", "low", "high", "original"] = "auto"


class InputFile(Wire, tag_field="type", tag="input_file"):
    file_id: str | None = None
    file_data: str | None = None
    file_url: str | None = None
    filename: str | None = None


ContentPart = InputText | OutputText | Refusal | InputImage | InputFile


class MessageItem(Wire, tag_field="type", tag="message"):
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]
    id: str | None = None
    status: str | None = None
    phase: Literal["commentary", "final_answer"] | None = None


class FunctionCallItem(Wire, tag_field="type", tag="function_call"):
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(Wire, tag_field="type", tag="function_call_output"):
    call_id: str
    output: str | list[InputText | InputImage | InputFile]
    id: str | None = None
    status: str | None = None


class SummaryText(Wire, tag_field="type", tag="summary_text"):
    text: str


class ReasoningText(Wire, tag_field="type", tag="reasoning_text"):
    text: str


class ReasoningItem(Wire, tag_field="type", tag="reasoning"):
    summary: list[SummaryText] | None = None
    id: str | None = None
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: str | None = None


class WebSearchCallItem(Wire, tag_field="type", tag="web_search_call"):
    """A past web search: dropped, as the web_search tool is."""

    id: str | None = None
    status: str | None = None
    action: dict[str, Any] | None = None


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem | WebSearchCallItem


class FunctionTool(Wire):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: Any = None
    strict: bool | None = None
    defer_loading: bool | None = None  # accepted; every tool is declared up front (no tool search)


class NamedToolChoice(Wire, tag_field="type", tag="function"):
    name: str


class WebSearchChoice(Wire, tag_field="type", tag="web_search"):
    """The web_search tool is dropped, so choosing it is ``auto``."""


class DatedWebSearchChoice(Wire, tag_field="type", tag="web_search_2025_08_26"):
    """The web_search tool is dropped, so choosing it is ``auto``."""


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
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: (
        Literal["none", "auto", "required"] | NamedToolChoice | WebSearchChoice | DatedWebSearchChoice | None
    ) = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = None
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    include: list[str] | None = None
    metadata: dict[str, str] | None = None
    ignore_eos: bool | None = None  # extension, as in Chat Completions: generate past EOS
    user: str | None = None
    store: bool | None = None
    background: bool | None = None
    previous_response_id: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
