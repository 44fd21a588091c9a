"""Conversation: the one shape that every protocol request is parsed into before rendering.

A conversation is a list of messages plus the settings that change the prompt (tools,
tool_choice, thinking, reasoning effort, response format). Sampling settings live elsewhere
(:mod:`dsi.recipe.resolve`); nothing here depends on the protocol the request came in.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Literal


class ModelVersion(enum.Enum):
    """The prompt format a model speaks."""

    V4 = "V4"
    V41 = "V4.1"


class Effort(enum.Enum):
    """Reasoning effort of a thinking-mode request (``none`` turns thinking off instead)."""

    LOW = "low"
    HIGH = "high"
    XHIGH = "xhigh"
    MAX = "max"


@dataclass(slots=True, frozen=True)
class ImageRef:
    """An image by reference: an ``http(s)`` or ``data:`` URL; the bytes are fetched elsewhere.
    ``source_error``: why no vision model can take it (a file id, no source at all). V4 renders
    every image as a placeholder, so only V4.1 refuses such an image, with this message."""

    url: str
    detail: str = "auto"
    source_error: str | None = None


# A text-bearing message body: text pieces and images, joined by blank lines when rendered.
Parts = tuple[str | ImageRef, ...]


@dataclass(slots=True, frozen=True)
class ToolCall:
    """A past tool call. ``arguments`` is the caller's JSON text (an object, normally)."""

    id: str
    name: str
    arguments: str


@dataclass(slots=True, frozen=True)
class SystemMessage:
    parts: Parts


@dataclass(slots=True, frozen=True)
class DeveloperMessage:
    """Instructions from the developer: a user message in V4, a system message in V4.1.
    ``reminder``: a Messages ``system``-role turn, whose V4 text is wrapped in
    ``<system-reminder>`` tags."""

    parts: Parts
    reminder: bool = False


@dataclass(slots=True, frozen=True)
class UserMessage:
    parts: Parts


@dataclass(slots=True, frozen=True)
class AssistantMessage:
    """``reasoning`` None means the client sent none; ``prefix`` continues this message;
    ``image``: the client's content held an image (V4 shows a placeholder in ``content``, V4.1
    refuses it)."""

    content: str
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    prefix: bool = False
    image: bool = False


@dataclass(slots=True, frozen=True)
class ToolResult:
    call_id: str
    parts: Parts


@dataclass(slots=True, frozen=True)
class LatestReminder:
    content: str


Message = SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolResult | LatestReminder


@dataclass(slots=True, frozen=True)
class ToolSpec:
    """A client function tool: name, description, JSON Schema of its arguments, strict flag."""

    name: str
    description: str | None = None
    parameters: Any = None
    strict: bool | None = None


@dataclass(slots=True, frozen=True)
class ResponseFormat:
    """``text`` (unconstrained), ``json_object`` (any JSON object), ``json_schema`` or ``regex``
    (text matching ``regex`` in full). ``in_prompt``: the system block states the format (the
    output is constrained either way; Messages' ``output_config.format`` is not stated, as in
    deepseek-recipe)."""

    kind: Literal["text", "json_object", "json_schema", "regex"] = "text"
    schema: Any = None
    name: str | None = None
    strict: bool = False
    regex: str | None = None
    in_prompt: bool = True


ToolChoice = Literal["auto", "none", "required"]


@dataclass(slots=True, frozen=True)
class Conversation:
    """Messages and prompt settings. ``tool_choice`` is ``required`` for a named tool too, with
    ``forced_tool`` naming it; ``effort`` is None exactly when ``thinking`` is off."""

    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice = "auto"
    forced_tool: str | None = None
    thinking: bool = True
    effort: Effort | None = Effort.HIGH
    response_format: ResponseFormat = field(default_factory=ResponseFormat)

    @property
    def active_tools(self) -> tuple[ToolSpec, ...]:
        """The tools the prompt declares: none under ``tool_choice: none``."""
        return () if self.tool_choice == "none" else self.tools

    def images(self) -> tuple[ImageRef, ...]:
        """Every image, in prompt order."""
        out: list[ImageRef] = []
        for msg in self.messages:
            out.extend(p for p in getattr(msg, "parts", ()) if isinstance(p, ImageRef))
        return tuple(out)
