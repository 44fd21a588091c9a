"""deepseek-recipe 0.2.0 as the test oracle: our Conversation in its types, its renders and ids."""

from __future__ import annotations

import functools
from typing import Any

import deepseek_recipe as dr

from dsi.recipe.conversation import (
    AssistantMessage,
    Conversation,
    DeveloperMessage,
    ImageRef,
    LatestReminder,
    ModelVersion,
    Parts,
    SystemMessage,
    ToolResult,
    UserMessage,
)
from dsi.tokenizer import tokenizer_path

_IMAGE_TOKEN = "<｜image｜>"


@functools.lru_cache(maxsize=1)
def tokenizer() -> dr.Tokenizer:
    return dr.Tokenizer.from_file(str(tokenizer_path()))


@functools.lru_cache(maxsize=2)
def encoding(version: ModelVersion) -> Any:
    enc = dr.DeepseekV4Encoding() if version is ModelVersion.V4 else dr.DeepseekV41Encoding()
    return enc.with_tokenizer(tokenizer())


def version_of(model_version: Any) -> ModelVersion:
    return ModelVersion.V4 if model_version == dr.ModelVersion.DeepseekV4Pro else ModelVersion.V41


def _text(parts: Parts, version: ModelVersion) -> tuple[str, list[Any]]:
    texts, images = [], []
    for p in parts:
        if isinstance(p, ImageRef):
            texts.append("[Unsupported Image]" if version is ModelVersion.V4 else _IMAGE_TOKEN)
            if version is ModelVersion.V41:
                images.append(dr.UrlImageSource("https://example.invalid/x.png"))
        else:
            texts.append(p)
    return "\n\n".join(texts), images


def to_oracle(conv: Conversation, version: ModelVersion) -> dr.Conversation:
    """Our conversation as a deepseek-recipe Conversation (for rendering comparisons)."""
    msgs: list[Any] = []
    for m in conv.messages:
        if isinstance(m, DeveloperMessage):  # deepseek-recipe converts it per version
            text, imgs = _text(m.parts, version)
            cls = dr.UserMessage if version is ModelVersion.V4 else dr.SystemMessage
            msgs.append(cls(text, imgs or None))
        elif isinstance(m, SystemMessage):
            text, imgs = _text(m.parts, version)
            msgs.append(dr.SystemMessage(text, imgs or None))
        elif isinstance(m, UserMessage):
            text, imgs = _text(m.parts, version)
            msgs.append(dr.UserMessage(text, imgs or None))
        elif isinstance(m, ToolResult):
            text, imgs = _text(m.parts, version)
            msgs.append(dr.ToolMessage(text, m.call_id, imgs or None))
        elif isinstance(m, AssistantMessage):
            calls = [dr.ToolCall(c.id, c.name, c.arguments) for c in m.tool_calls]
            msgs.append(dr.AssistantMessage(m.content, m.reasoning, calls or None, m.prefix))
        elif isinstance(m, LatestReminder):
            msgs.append(dr.LatestReminderMessage(m.content))
    tools = [dr.ToolDefinition(t.name, t.description, t.parameters, t.strict) for t in conv.tools]
    rf = conv.response_format
    return dr.Conversation(
        msgs,
        thinking_mode=conv.thinking,
        tools=tools or None,
        tool_choice=conv.tool_choice,
        reasoning_effort=conv.effort.value if conv.effort else None,
        response_format="json_object" if rf.kind == "json_object" else "text",
        response_schema=rf.schema if rf.kind == "json_schema" else None,
    )
