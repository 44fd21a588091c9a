"""Conversation -> typed segments, in the V4 and V4.1 prompt formats.

    V4    BOS [effort][systems][## Tools][## Response Format]
          ( USER blocks | LATEST_REMINDER text | ASSISTANT think content [dsml] EOS )*
          ASSISTANT (THINK | END_THINK) [DSML opener when tool_choice is required]
    V4.1  BOS [SYSTEM effort first-system tools format] ( SYSTEM text | USER ... )* ASSISTANT ...

V4 lifts every system message into the head; V4.1 writes them where they occur. User messages
and tool results that follow each other share one user turn, as blocks joined by blank lines.
The details (which reasoning is kept, where tool results go) follow deepseek-recipe 0.2.0.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dsi.recipe.conversation import (
    AssistantMessage,
    Conversation,
    DeveloperMessage,
    ImageRef,
    LatestReminder,
    Message,
    ModelVersion,
    Parts,
    SystemMessage,
    ToolResult,
    UserMessage,
)
from dsi.recipe.segments import Control, RenderedPrompt, Segment
from dsi.recipe.templates import (
    V4_DSML,
    V4_EFFORT_TEXT,
    V41_DSML,
    required_call_opener,
    response_format_section,
    tool_calls_block,
    tools_section,
    v41_effort_text,
)
from dsi.recipe.vision import V4_IMAGE_TEXT


@dataclass(slots=True, frozen=True)
class Rendered:
    """A rendered prompt, and whether generation starts inside ``<think>``."""

    prompt: RenderedPrompt
    ends_in_thinking: bool


def render(conv: Conversation, version: ModelVersion) -> Rendered:
    """``conv`` as ``version``'s prompt: head, turns, then the generation prompt (unless the last
    message is continued)."""
    v4 = version is ModelVersion.V4
    if any(isinstance(m, DeveloperMessage) for m in conv.messages):
        conv = replace(conv, messages=tuple(_developer(m, v4) for m in conv.messages))
    head = _v4_head(conv) if v4 else _v41_head(conv)
    if v4:
        body = [m for m in conv.messages if not isinstance(m, SystemMessage)]
        turns = _turns(_claim_results(_merge_users(body)), v4, offset=0)
    else:
        body = list(conv.messages[1:] if _starts_with_system(conv) else conv.messages)
        # the head counts as a message when it holds a system message, tools or a format
        turns = _turns(body, v4, offset=int(_starts_with_system(conv) or _has_extras(conv)))
    segments: list[Segment] = [Control.BOS, *head]
    for i, turn in enumerate(turns):
        segments += turn.render(conv, v4, last=i == len(turns) - 1)
    tail = turns[-1] if turns else None
    if isinstance(tail, _AssistantTurn) and tail.continued(v4, last=True):
        ends_in_thinking = tail.open_reasoning
    else:
        segments += [Control.ASSISTANT, Control.THINK if conv.thinking else Control.END_THINK]
        ends_in_thinking = conv.thinking
    if conv.tool_choice == "required" and conv.active_tools:
        segments += required_call_opener(V4_DSML if v4 else V41_DSML)
        ends_in_thinking = False
    return Rendered(RenderedPrompt.from_segments(segments), ends_in_thinking)


def _developer(msg: Message, v4: bool) -> Message:
    if not isinstance(msg, DeveloperMessage):
        return msg
    if not v4:
        return SystemMessage(msg.parts)
    if not msg.reminder:
        return UserMessage(msg.parts)
    text = _v4_text(msg.parts)
    return UserMessage((f"<system-reminder>\n{text}\n</system-reminder>" if text else "",))


# -- head ----------------------------------------------------------------------------------


def _v4_head(conv: Conversation) -> list[Segment]:
    out: list[Segment] = []
    if conv.thinking and conv.effort is not None:
        out.append(V4_EFFORT_TEXT[conv.effort])
    systems = [_parts(m.parts, True) for m in conv.messages if isinstance(m, SystemMessage)]
    for i, sys in enumerate(s for s in systems if not _blank(s)):
        out += (["\n\n"] if i else []) + sys
    out += tools_section(conv.active_tools, V4_DSML)
    out += response_format_section(conv.response_format, v4=True)
    return out


def _v41_head(conv: Conversation) -> list[Segment]:
    out: list[Segment] = []
    if conv.thinking and conv.effort is not None:
        out.append(v41_effort_text(conv.effort))
    if _starts_with_system(conv):
        out += _parts(conv.messages[0].parts, False)  # type: ignore[union-attr]
    out += tools_section(conv.active_tools, V41_DSML)
    out += response_format_section(conv.response_format, v4=False)
    if _starts_with_system(conv) or _has_extras(conv) or (out and conv.messages):
        return [Control.SYSTEM, *out]
    return []  # an empty conversation gets no head for the effort alone


def _starts_with_system(conv: Conversation) -> bool:
    return bool(conv.messages) and isinstance(conv.messages[0], SystemMessage)


def _has_extras(conv: Conversation) -> bool:
    return bool(conv.active_tools) or bool(response_format_section(conv.response_format, v4=False))


def _parts(parts: Parts, v4: bool) -> list[Segment]:
    out: list[Segment] = []
    for i, part in enumerate(parts):
        if i:
            out.append("\n\n")
        if isinstance(part, ImageRef):
            out.append(V4_IMAGE_TEXT if v4 else Control.IMAGE)
        else:
            out.append(part)
    return out


def _blank(segments: list[Segment]) -> bool:
    return all(s == "" for s in segments)


# -- turns ---------------------------------------------------------------------------------


@dataclass(slots=True)
class _UserTurn:
    """User messages and tool results sharing one ``<｜User｜>`` turn: blocks joined by blank lines."""

    blocks: list[ToolResult | list[Segment]]
    open_tools: bool  # the turn ends in a tool result, so (in V4) a following result joins it

    def render(self, conv: Conversation, v4: bool, last: bool) -> list[Segment]:
        out: list[Segment] = [Control.USER]
        for i, block in enumerate(self.blocks):
            if i:
                out.append("\n\n")
            if isinstance(block, ToolResult):
                out += ["<tool_result>", *_parts(block.parts, v4), "</tool_result>"]
            else:
                out += block
        return out


@dataclass(slots=True)
class _AssistantTurn:
    msg: AssistantMessage
    after_user: bool  # past the last user message or tool result (V4.1 keeps reasoning then)
    open_reasoning: bool = False

    def continued(self, v4: bool, last: bool) -> bool:
        """A prefix message is continued, not closed (V4 honours it on the last message only)."""
        return self.msg.prefix and (last or not v4)

    def render(self, conv: Conversation, v4: bool, last: bool) -> list[Segment]:
        msg = self.msg
        continued = self.continued(v4, last)
        think = self._v4_think(conv, continued) if v4 else self._v41_think(conv, continued)
        out: list[Segment] = [Control.ASSISTANT, *think, msg.content]
        if msg.tool_calls:
            out += tool_calls_block(msg.tool_calls, V4_DSML if v4 else V41_DSML)
        if not continued:
            out.append(Control.EOS)
        return out

    def _v4_think(self, conv: Conversation, continued: bool) -> list[Segment]:
        """V4 keeps past reasoning only with tools declared; a continued message keeps its own
        and, in thinking mode with no content yet, stays inside it."""
        msg = self.msg
        if not continued:
            if msg.reasoning is not None and conv.active_tools:
                return [Control.THINK, msg.reasoning, Control.END_THINK]
            return [Control.END_THINK]
        inside = conv.thinking and not msg.content
        if msg.reasoning is None:
            return [] if inside else [Control.END_THINK]
        if inside:
            self.open_reasoning = not msg.tool_calls
            return [Control.THINK, msg.reasoning]
        return [Control.THINK, msg.reasoning, Control.END_THINK]

    def _v41_think(self, conv: Conversation, continued: bool) -> list[Segment]:
        """V4.1 writes reasoning only in thinking mode, with tools declared or in a continued
        message past the last user turn."""
        msg = self.msg
        if not (conv.thinking and (conv.active_tools or (continued and self.after_user))):
            return [Control.END_THINK]
        if continued and not msg.content and not msg.tool_calls:
            self.open_reasoning = True
            return [Control.THINK, msg.reasoning or ""]
        return [Control.THINK, msg.reasoning or "", Control.END_THINK]


@dataclass(slots=True)
class _Single:
    segments: list[Segment]

    def render(self, conv: Conversation, v4: bool, last: bool) -> list[Segment]:
        return self.segments


_Turn = _UserTurn | _AssistantTurn | _Single


def _turns(messages: list[Message], v4: bool, offset: int) -> list[_Turn]:
    """Group messages into turns. ``offset``: how many head messages precede ``messages``."""
    turns: list[_Turn] = []
    call_order: dict[str, int] = {}
    last_user = max(
        (i + offset for i, m in enumerate(messages) if isinstance(m, UserMessage | ToolResult)), default=0
    )
    for index, msg in enumerate(messages, start=offset):
        prev = turns[-1] if turns else None
        if isinstance(msg, UserMessage):
            if isinstance(prev, _UserTurn):
                prev.blocks.append(_parts(msg.parts, v4))
                prev.open_tools = False
            else:
                turns.append(_UserTurn([_parts(msg.parts, v4)], False))
        elif isinstance(msg, ToolResult):
            if isinstance(prev, _UserTurn) and (prev.open_tools or not v4):
                prev.blocks.append(msg)
                prev.open_tools = True
                if not v4:
                    _sort_results(prev, call_order)
            else:
                turns.append(_UserTurn([msg], True))
        elif isinstance(msg, AssistantMessage):
            if msg.tool_calls:
                call_order = {}
                for i, call in enumerate(msg.tool_calls):
                    call_order.setdefault(call.id, i)
            turns.append(_AssistantTurn(msg, index > last_user))
        elif isinstance(msg, LatestReminder):
            if not v4 and isinstance(prev, _Single) and prev.segments[0] is Control.LATEST_REMINDER:
                continue  # V4.1 keeps only the first of consecutive reminders
            turns.append(_Single([Control.LATEST_REMINDER, msg.content]))
        elif isinstance(msg, SystemMessage):
            turns.append(_Single([Control.SYSTEM, *_parts(msg.parts, v4)]))
    return turns


def _merge_users(messages: list[Message]) -> list[Message]:
    """V4: consecutive user messages become one; texts joined by blank lines, empty ones left out."""
    out: list[Message] = []
    for msg in messages:
        if isinstance(msg, UserMessage) and out and isinstance(out[-1], UserMessage):
            texts = [t for t in (_v4_text(out[-1].parts), _v4_text(msg.parts)) if t]
            out[-1] = UserMessage(("\n\n".join(texts),))
        else:
            out.append(msg)
    return out


def _v4_text(parts: Parts) -> str:
    return "\n\n".join(V4_IMAGE_TEXT if isinstance(p, ImageRef) else p for p in parts)


def _claim_results(messages: list[Message]) -> list[Message]:
    """V4: an assistant's calls are written in the order of their ids, and the assistant claims
    the tool results among the k messages after it (k = its number of calls, positions in the
    original list, only when k more messages follow). Claimed results move to just after their
    assistant, sorted by call id; everything else keeps its order."""
    claims: dict[int, list[int]] = {}
    claimed: set[int] = set()
    for i, msg in enumerate(messages):
        if isinstance(msg, AssistantMessage) and msg.tool_calls and i + len(msg.tool_calls) < len(messages):
            window = range(i + 1, i + 1 + len(msg.tool_calls))
            mine = [j for j in window if isinstance(messages[j], ToolResult) and j not in claimed]
            claims[i] = sorted(mine, key=lambda j: messages[j].call_id)  # type: ignore[union-attr]
            claimed.update(mine)
    out: list[Message] = []
    for i, msg in enumerate(messages):
        if i in claimed:
            continue
        if isinstance(msg, AssistantMessage) and msg.tool_calls:
            msg = replace(msg, tool_calls=tuple(sorted(msg.tool_calls, key=lambda c: c.id)))
        out.append(msg)
        out.extend(messages[j] for j in claims.get(i, ()))
    return out


def _sort_results(turn: _UserTurn, order: dict[str, int]) -> None:
    """V4.1: the turn's tool results in the order of the calls they answer (stable; an unknown
    id sorts as the first call), in the places results already hold."""
    results = sorted(
        (b for b in turn.blocks if isinstance(b, ToolResult)), key=lambda m: order.get(m.call_id, 0)
    )
    it = iter(results)
    turn.blocks = [next(it) if isinstance(b, ToolResult) else b for b in turn.blocks]
