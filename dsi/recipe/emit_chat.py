"""OpenAI Chat Completions: ``chat.completion.chunk`` SSE events and the ``chat.completion`` body.

Stream, one engine step at a time (kinds never interleave within a step, so each kind is at
most one chunk per step)::

    data: {... "delta": {"role": "assistant", "reasoning_content": "Let me"} ...}
    data: {... "delta": {"content": "Sunny"} ...}
    data: {... "delta": {"tool_calls": [{"index": 0, "id": "call_..", "type": "function",
                                         "function": {"name": "f", "arguments": ""}}]} ...}
    data: {... "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\\"a\\": 1}"}}]} ...}
    data: {... "delta": {}, "finish_reason": "tool_calls"}
    data: {... "choices": [], "usage": {...}}          only with include_usage
    data: [DONE]

With ``include_usage`` every chunk carries ``"usage": null`` and one more chunk carries the
usage with empty ``choices``. A failure ends the stream with ``data: {"error": {...}}``.

With ``logprobs`` a content chunk's choice carries ``"logprobs": {"content": [...], "refusal":
null}`` with the entries of the content ids generated since the last such chunk (the finish
chunk takes any left); the body's choice lists them all (see ``dsi.recipe.logprobs``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dsi.recipe.emit_common import OutputOptions, StepEvent, Usage, sse_data, to_json
from dsi.recipe.logprobs import ContentLogprobs
from dsi.recipe.parser import (
    ContentDelta,
    Finish,
    FinishReason,
    ReasoningDelta,
    ToolCallDelta,
    ToolCallStart,
)

_FINISH: dict[FinishReason, str] = {
    "stop": "stop",
    "stop_sequence": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
}


def usage_json(u: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
        "prompt_cache_hit_tokens": u.cached_tokens,
        "prompt_cache_miss_tokens": u.prompt_tokens - u.cached_tokens,
    }


def error_json(message: str, kind: str = "server_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


class ChatWriter:
    def __init__(self, options: OutputOptions) -> None:
        self._o = options
        head = {
            "id": options.request_id,
            "object": "chat.completion.chunk",
            "created": options.created,
            "model": options.model,
            "system_fingerprint": None,
        }
        # Every chunk is this prefix + delta + suffix; only the delta is encoded per step.
        self._prefix = "data: " + to_json(head)[:-1] + ',"choices":[{"index":0,"delta":'
        self._usage_null = ',"usage":null' if options.include_usage else ""
        # A text delta with no logprobs to carry (nearly every chunk): head + JSON string + tail.
        self._tail = ',"logprobs":null,"finish_reason":null}]' + self._usage_null + "}\n\n"
        self._content_head = self._prefix + '{"content":'
        self._reasoning_head = self._prefix + '{"reasoning_content":'
        self._role_sent = False
        self._reasoning: list[str] = []
        self._content: list[str] = []
        self._calls: list[tuple[str, str, list[str]]] = []  # id, name, argument fragments
        self._logprobs: list[dict[str, Any]] = []  # every content entry, for the body
        self._unsent: list[dict[str, Any]] = []  # entries no chunk carried yet
        self._finish: Finish | None = None
        self._usage: Usage | None = None
        self._error: dict[str, Any] | None = None

    def _chunk(
        self, delta: dict[str, Any], finish_reason: str | None = None, with_logprobs: bool = False
    ) -> str:
        if not self._role_sent:
            delta = {"role": "assistant", **delta}
            self._role_sent = True
        reason = "null" if finish_reason is None else f'"{finish_reason}"'
        logprobs = "null"
        if with_logprobs and self._unsent:
            logprobs = to_json({"content": self._unsent, "refusal": None})
            self._unsent = []
        return (
            f'{self._prefix}{to_json(delta)},"logprobs":{logprobs},"finish_reason":{reason}}}]'
            f"{self._usage_null}}}\n\n"
        )

    def start(self, usage: Usage) -> list[str]:
        return []

    def step(self, events: Sequence[StepEvent]) -> list[str]:
        if len(events) == 1 and self._role_sent:  # the usual step: one text delta
            e = events[0]
            if type(e) is ContentDelta and not self._unsent:
                self._content.append(e.text)
                return [f"{self._content_head}{to_json(e.text)}}}{self._tail}"]
            if type(e) is ReasoningDelta:
                self._reasoning.append(e.text)
                return [f"{self._reasoning_head}{to_json(e.text)}}}{self._tail}"]
        out: list[str] = []
        for e in events:
            if type(e) is ContentLogprobs:
                self._logprobs += e.entries
                self._unsent += e.entries
            elif type(e) is ContentDelta:
                self._content.append(e.text)
                if self._role_sent and not self._unsent:
                    out.append(f"{self._content_head}{to_json(e.text)}}}{self._tail}")
                else:
                    out.append(self._chunk({"content": e.text}, with_logprobs=True))
            elif type(e) is ReasoningDelta:
                self._reasoning.append(e.text)
                if self._role_sent:
                    out.append(f"{self._reasoning_head}{to_json(e.text)}}}{self._tail}")
                else:
                    out.append(self._chunk({"reasoning_content": e.text}))
            elif type(e) is ToolCallStart:
                self._calls.append((e.id, e.name, []))
                call = {"index": e.index, "id": e.id, "type": "function"}
                out.append(
                    self._chunk({"tool_calls": [{**call, "function": {"name": e.name, "arguments": ""}}]})
                )
            elif type(e) is ToolCallDelta:
                self._calls[e.index][2].append(e.arguments)
                out.append(
                    self._chunk({"tool_calls": [{"index": e.index, "function": {"arguments": e.arguments}}]})
                )
        if not self._role_sent:
            out.append(self._chunk({"content": ""}, with_logprobs=True))
        return out

    def end(self, finish: Finish, usage: Usage, message: str) -> list[str]:
        self._finish, self._usage = finish, usage
        if finish.reason in ("abort", "error"):
            self._error = error_json(message)
            return [sse_data(self._error)]
        out = [self._chunk({}, _FINISH[finish.reason], with_logprobs=True)]
        if self._o.include_usage:
            o = self._o
            last = {
                "id": o.request_id,
                "object": "chat.completion.chunk",
                "created": o.created,
                "model": o.model,
            }
            out.append(
                sse_data({**last, "system_fingerprint": None, "choices": [], "usage": usage_json(usage)})
            )
        out.append("data: [DONE]\n\n")
        return out

    def body(self) -> dict[str, Any]:
        if self._finish is None or self._usage is None:
            raise RuntimeError("body() before the message finished")
        if self._error is not None:
            return self._error
        content = "".join(self._content)
        message: dict[str, Any] = {"role": "assistant", "content": content or (None if self._calls else "")}
        if self._o.thinking or self._reasoning:
            message["reasoning_content"] = "".join(self._reasoning)
        if self._calls:
            message["tool_calls"] = [
                {"id": i, "type": "function", "function": {"name": name, "arguments": "".join(args)}}
                for i, name, args in self._calls
            ]
        o = self._o
        return {
            "id": o.request_id,
            "object": "chat.completion",
            "created": o.created,
            "model": o.model,
            "system_fingerprint": None,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": {"content": self._logprobs, "refusal": None} if o.logprobs else None,
                    "finish_reason": _FINISH[self._finish.reason],
                }
            ],
            "usage": usage_json(self._usage),
        }
