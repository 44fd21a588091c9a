"""OpenAI Responses: named SSE events with a strictly increasing ``sequence_number``.

    response.created, response.in_progress
    reasoning:      output_item.added, content_part.added (reasoning_text),
                    reasoning_text.delta*, reasoning_text.done, content_part.done, output_item.done
    message:        output_item.added, content_part.added (output_text),
                    output_text.delta*, output_text.done, content_part.done, output_item.done
    function_call:  output_item.added, function_call_arguments.delta*,
                    function_call_arguments.done, output_item.done
    response.completed | response.incomplete (max_output_tokens) | response.failed

No ``[DONE]``. An item cut by the length limit is done with status ``incomplete``. The
non-streamed body is the response object that ``response.completed`` (or ``incomplete``)
carries.

With ``logprobs`` each ``output_text.delta`` carries the entries of the content ids generated
since the last one (entries left when the message closes come in a delta with empty text);
``output_text.done`` and the ``output_text`` part list all of the message's (see
``dsi.recipe.logprobs``). Entries of content ids whose text never reached a message
(only newlines before a tool call) are not reported. Without it, ``logprobs`` is ``[]``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from dsi.recipe.emit_common import OutputOptions, StepEvent, Usage, derived_id, sse_event
from dsi.recipe.logprobs import ContentLogprobs
from dsi.recipe.parser import (
    ContentDelta,
    Finish,
    ReasoningDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
)


def usage_json(u: Usage) -> dict[str, Any]:
    return {
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
        "total_tokens": u.total_tokens,
    }


def error_json(message: str, kind: str = "server_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": kind}}


class _Item:
    """One output item in progress: its JSON, where its text (and a message's logprobs) go."""

    __slots__ = ("index", "json", "logprobs", "parts")

    def __init__(self, index: int, item: dict[str, Any]) -> None:
        self.index, self.json, self.parts = index, item, []
        self.logprobs: list[dict[str, Any]] = []


class ResponsesWriter:
    def __init__(self, options: OutputOptions) -> None:
        self._o = options
        self._seq = 0
        self._output: list[dict[str, Any]] = []
        self._item: _Item | None = None
        self._unsent: list[dict[str, Any]] = []  # content logprob entries no delta carried yet
        self._response: dict[str, Any] = self._response_json("in_progress")
        self._error: dict[str, Any] | None = None

    def _response_json(self, status: str) -> dict[str, Any]:
        o = self._o
        base = {
            "id": o.request_id,
            "object": "response",
            "created_at": o.created,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "instructions": None,
            "max_output_tokens": None,
            "model": o.model,
            "output": [],
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": False,
            "temperature": 1.0,
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": [],
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": None,
            "user": None,
            "metadata": {},
        }
        return {**base, **o.response_fields}

    def _event(self, name: str, payload: dict[str, Any]) -> str:
        data = {"type": name, **payload, "sequence_number": self._seq}
        self._seq += 1
        return sse_event(name, data)

    def start(self, usage: Usage) -> list[str]:
        r = self._response
        return [
            self._event("response.created", {"response": r}),
            self._event("response.in_progress", {"response": r}),
        ]

    # -- items ----------------------------------------------------------------------------------

    def _open(self, kind: str, out: list[str], **fields: Any) -> _Item:
        self._close(out, "completed")
        index = len(self._output)
        prefix = {"reasoning": "rs_", "message": "msg_", "function_call": "fc_"}[kind]
        item = {
            "id": derived_id(prefix, self._o.request_id, index),
            "type": kind,
            "status": "in_progress",
            **fields,
        }
        self._output.append(item)
        self._item = it = _Item(index, item)
        out.append(self._event("response.output_item.added", {"output_index": index, "item": dict(item)}))
        part = self._part(kind, "", [])
        if part is not None:
            ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
            out.append(self._event("response.content_part.added", {**ids, "part": part}))
        return it

    @staticmethod
    def _part(kind: str, text: str, logprobs: list[dict[str, Any]]) -> dict[str, Any] | None:
        if kind == "reasoning":
            return {"type": "reasoning_text", "text": text}
        if kind == "message":
            return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}
        return None

    def _close(self, out: list[str], status: str) -> None:
        it, self._item = self._item, None
        if it is None:
            return
        item, kind = it.json, it.json["type"]
        ids = {"item_id": item["id"], "output_index": it.index}
        text = "".join(it.parts)
        if kind == "function_call":
            item["arguments"] = text
            out.append(self._event("response.function_call_arguments.done", {**ids, "arguments": text}))
        else:
            if kind == "message" and self._unsent:  # entries of ids whose text never came: an empty delta
                self._delta(it, "response.output_text.delta", "", out)
            part = self._part(kind, text, it.logprobs)
            item["content"] = [part]
            done = {**ids, "content_index": 0, "text": text}
            if kind == "message":
                done["logprobs"] = it.logprobs
            name = "response.reasoning_text.done" if kind == "reasoning" else "response.output_text.done"
            out.append(self._event(name, done))
            out.append(self._event("response.content_part.done", {**ids, "content_index": 0, "part": part}))
        item["status"] = status
        out.append(self._event("response.output_item.done", {"output_index": it.index, "item": item}))

    def _delta(self, it: _Item, name: str, text: str, out: list[str]) -> None:
        it.parts.append(text)
        payload: dict[str, Any] = {"item_id": it.json["id"], "output_index": it.index}
        if name != "response.function_call_arguments.delta":
            payload["content_index"] = 0
        if name == "response.output_text.delta":
            payload["logprobs"], self._unsent = self._unsent, []
            it.logprobs += payload["logprobs"]
        out.append(self._event(name, {**payload, "delta": text}))

    def step(self, events: Sequence[StepEvent]) -> list[str]:
        out: list[str] = []
        for e in events:
            it = self._item
            if type(e) is ContentLogprobs:
                self._unsent += e.entries
            elif type(e) is ReasoningDelta:
                if it is None or it.json["type"] != "reasoning":
                    it = self._open("reasoning", out, summary=[], content=[])
                self._delta(it, "response.reasoning_text.delta", e.text, out)
            elif type(e) is ContentDelta:
                if it is None or it.json["type"] != "message":
                    it = self._open("message", out, role="assistant", content=[])
                self._delta(it, "response.output_text.delta", e.text, out)
            elif type(e) is ToolCallStart:
                self._open("function_call", out, call_id=e.id, name=e.name, arguments="")
            elif type(e) is ToolCallDelta and it is not None:
                self._delta(it, "response.function_call_arguments.delta", e.arguments, out)
            elif type(e) is ToolCallEnd:
                self._close(out, "completed" if e.complete else "incomplete")
        return out

    def end(self, finish: Finish, usage: Usage, message: str) -> list[str]:
        out: list[str] = []
        failed = finish.reason in ("abort", "error")
        self._close(out, "incomplete" if finish.reason == "length" or failed else "completed")
        r = self._response
        r["output"], r["usage"] = self._output, usage_json(usage)
        if failed:
            r["status"] = "failed"
            r["error"] = {"code": "server_error", "message": message}
            self._error = error_json(message)
            out.append(self._event("response.failed", {"response": r}))
        elif finish.reason == "length":
            r["status"], r["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
            out.append(self._event("response.incomplete", {"response": r}))
        else:
            r["status"], r["completed_at"] = "completed", int(time.time())
            out.append(self._event("response.completed", {"response": r}))
        return out

    def body(self) -> dict[str, Any]:
        if self._response["status"] == "in_progress":
            raise RuntimeError("body() before the response finished")
        return self._error if self._error is not None else self._response
