"""Anthropic Messages: named SSE events, content blocks with contiguous indices.

    message_start
    content_block_start {thinking}  thinking_delta*  signature_delta  content_block_stop
    content_block_start {text}      text_delta*                       content_block_stop
    content_block_start {tool_use}  input_json_delta*                 content_block_stop
    message_delta {stop_reason: end_turn | max_tokens | tool_use | stop_sequence}
    message_stop

A failure ends the stream with ``event: error``. Tool ids are ``toolu_...``. ``input_tokens``
counts the prompt tokens that were not read from the cache, as Anthropic reports them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from dsi.recipe.emit_common import OutputOptions, StepEvent, Usage, derived_id, sse_event
from dsi.recipe.parser import (
    ContentDelta,
    Finish,
    FinishReason,
    ReasoningDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
)

_STOP_REASON: dict[FinishReason, str] = {
    "stop": "end_turn",
    "stop_sequence": "stop_sequence",
    "length": "max_tokens",
    "tool_calls": "tool_use",
}


def usage_json(u: Usage) -> dict[str, Any]:
    return {
        "input_tokens": u.prompt_tokens - u.cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": u.cached_tokens,
        "output_tokens": u.completion_tokens,
    }


def error_json(message: str, kind: str = "api_error") -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


class MessagesWriter:
    def __init__(self, options: OutputOptions) -> None:
        self._o = options
        self._blocks: list[dict[str, Any]] = []
        self._parts: list[str] = []  # text of the open block
        self._open: dict[str, Any] | None = None
        self._signature = derived_id("sig_", options.request_id, "thinking", length=43)
        self._message: dict[str, Any] = {
            "id": options.request_id,
            "type": "message",
            "role": "assistant",
            "model": options.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage_json(Usage(options.prompt_tokens, 0, options.cached_tokens)),
        }
        self._error: dict[str, Any] | None = None

    def start(self, usage: Usage) -> list[str]:
        self._message["usage"] = usage_json(usage)
        return [sse_event("message_start", {"type": "message_start", "message": self._message})]

    def _start_block(self, block: dict[str, Any], out: list[str]) -> None:
        self._stop_block(out)
        index = len(self._blocks)
        self._blocks.append(block)
        self._open, self._parts = block, []
        start = {"type": "content_block_start", "index": index, "content_block": dict(block)}
        out.append(sse_event("content_block_start", start))

    def _delta(self, delta: dict[str, Any], text: str, out: list[str]) -> None:
        self._parts.append(text)
        payload = {"type": "content_block_delta", "index": len(self._blocks) - 1, "delta": delta}
        out.append(sse_event("content_block_delta", payload))

    def _stop_block(self, out: list[str]) -> None:
        block, self._open = self._open, None
        if block is None:
            return
        index = len(self._blocks) - 1
        text = "".join(self._parts)
        if block["type"] == "thinking":
            block["thinking"], block["signature"] = text, self._signature
            delta = {"type": "signature_delta", "signature": self._signature}
            out.append(
                sse_event(
                    "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
                )
            )
        elif block["type"] == "text":
            block["text"] = text
        else:
            block["input"] = json.loads(text)
        out.append(sse_event("content_block_stop", {"type": "content_block_stop", "index": index}))

    def step(self, events: Sequence[StepEvent]) -> list[str]:
        out: list[str] = []
        for e in events:
            kind = None if self._open is None else self._open["type"]
            if type(e) is ReasoningDelta:
                if kind != "thinking":
                    self._start_block({"type": "thinking", "thinking": "", "signature": ""}, out)
                self._delta({"type": "thinking_delta", "thinking": e.text}, e.text, out)
            elif type(e) is ContentDelta:
                if kind != "text":
                    self._start_block({"type": "text", "text": ""}, out)
                self._delta({"type": "text_delta", "text": e.text}, e.text, out)
            elif type(e) is ToolCallStart:
                self._start_block({"type": "tool_use", "id": e.id, "name": e.name, "input": {}}, out)
            elif type(e) is ToolCallDelta:
                self._delta({"type": "input_json_delta", "partial_json": e.arguments}, e.arguments, out)
            elif type(e) is ToolCallEnd:
                self._stop_block(out)
        return out

    def end(self, finish: Finish, usage: Usage, message: str) -> list[str]:
        out: list[str] = []
        self._stop_block(out)
        if finish.reason in ("abort", "error"):
            self._error = error_json(message)
            out.append(sse_event("error", self._error))
            return out
        m = self._message
        m["content"], m["usage"] = self._blocks, usage_json(usage)
        m["stop_reason"], m["stop_sequence"] = _STOP_REASON[finish.reason], finish.stop_sequence
        delta = {"stop_reason": m["stop_reason"], "stop_sequence": m["stop_sequence"]}
        out.append(sse_event("message_delta", {"type": "message_delta", "delta": delta, "usage": m["usage"]}))
        out.append(sse_event("message_stop", {"type": "message_stop"}))
        return out

    def body(self) -> dict[str, Any]:
        if self._error is not None:
            return self._error
        if self._message["stop_reason"] is None:
            raise RuntimeError("body() before the message finished")
        return self._message
