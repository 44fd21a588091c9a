"""The OpenAI Chat Completions request body as typed structs: an unknown field or a wrong type
is a 400 naming it (see dsi.recipe.wire)."""

from __future__ import annotations

from typing import Any, Literal

from dsi.recipe.request import EffortName
from dsi.recipe.wire import Wire


class TextPart(Wire, tag_field="type", tag="text"):
    text: str


class ImageURL(Wire):
    url: str
    detail: Literal["auto", "low", "high", "original"] = "auto"


class ImagePart(Wire, tag_field="type", tag="image_url"):
    image_url: ImageURL


class FileObject(Wire):
    file_id: str | None = None
    file_data: str | None = None
    filename: str | None = None


class FilePart(Wire, tag_field="type", tag="file"):
    file: FileObject


class RefusalPart(Wire, tag_field="type", tag="refusal"):
    refusal: str


class FunctionCall(Wire):
    name: str
    arguments: str


class ToolCallWire(Wire):
    id: str
    type: Literal["function"]
    function: FunctionCall


class SystemWire(Wire, tag_field="role", tag="system"):
    content: str | list[TextPart]
    name: str | None = None


class DeveloperWire(Wire, tag_field="role", tag="developer"):
    content: str | list[TextPart]
    name: str | None = None


class UserWire(Wire, tag_field="role", tag="user"):
    content: str | list[TextPart | ImagePart | FilePart]
    name: str | None = None


class AssistantWire(Wire, tag_field="role", tag="assistant"):
    content: str | list[TextPart | RefusalPart | ImagePart | FilePart] | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallWire] | None = None
    refusal: str | None = None
    name: str | None = None
    prefix: bool = False


class ToolWire(Wire, tag_field="role", tag="tool"):
    content: str | list[TextPart | ImagePart | FilePart]
    tool_call_id: str
    name: str | None = None  # the called function's name, known from the call already


class ReminderWire(Wire, tag_field="role", tag="latest_reminder"):
    content: str


MessageWire = SystemWire | DeveloperWire | UserWire | AssistantWire | ToolWire | ReminderWire


class FunctionDef(Wire):
    name: str
    description: str | None = None
    parameters: Any = None
    strict: bool | None = None


class ToolDef(Wire):
    type: Literal["function"]
    function: FunctionDef


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
    schema: Any
    name: str | None = None
    description: str | None = None
    strict: bool | None = None


class JsonSchemaFormat(Wire, tag_field="type", tag="json_schema"):
    json_schema: JsonSchemaSpec


class RegexFormat(Wire, tag_field="type", tag="regex"):
    regex: str


class StreamOptions(Wire):
    include_usage: bool = False
    include_obfuscation: bool | None = None


class Thinking(Wire):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None  # accepted, not a limit: deepseek-recipe ignores it too


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
    ignore_eos: bool | None = None  # extension, as vLLM's: generate past EOS up to max_tokens
    logit_bias: dict[str, float] | None = None
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: TextFormat | JsonObjectFormat | JsonSchemaFormat | RegexFormat | None = None
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
