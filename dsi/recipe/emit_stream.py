"""Token ids of one request -> the client's protocol, streamed or as one body.

    engine step ids --OutputParser--> events --ProtocolWriter--> SSE text pieces
                                                            \\--> body (non-streamed)

Use::

    out = OutputStream(options)
    for ids in engine_steps:
        await send(out.feed(ids))      # SSE pieces of this step (possibly none); with
                                       # options.logprobs, also the step's logprobs
        if out.done:                   # EOS or a stop string: the message is over
            break                      # abort the engine request
    await send(out.finish(reason))     # "stop" | "length" | "abort" | "error"; [] when done
    body = out.body()                  # the non-streamed response, from the same events

The first ``feed`` (or ``finish``) also returns the protocol's opening events. Deltas of one
kind are coalesced within a step, so a step yields at most one delta event per kind. With
``options.logprobs`` a step's ids go through the parser one at a time, so that each id is known
to be content or not (see ``dsi.recipe.logprobs``); the events are the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from tokenizers import Tokenizer

from dsi.recipe.emit_chat import ChatWriter
from dsi.recipe.emit_common import OutputOptions, ProtocolWriter, Usage, derived_id
from dsi.recipe.emit_messages import MessagesWriter
from dsi.recipe.emit_responses import ResponsesWriter
from dsi.recipe.logprobs import ContentLogprobs, TokenLogprobs
from dsi.recipe.parser import (
    ContentDelta,
    ControlIds,
    EngineFinish,
    Finish,
    OutputEvent,
    OutputParser,
    ReasoningDelta,
    ToolCallDelta,
)

_WRITERS = {"chat": ChatWriter, "responses": ResponsesWriter, "messages": MessagesWriter}
_TOOL_ID_PREFIX = {"chat": "call_", "responses": "call_", "messages": "toolu_"}
_DEFAULT_MESSAGE = {"abort": "the request was aborted", "error": "the engine failed while generating"}


class OutputStream:
    """One request's output: ``feed`` per engine step, then ``finish``; ``body`` afterwards."""

    def __init__(
        self, options: OutputOptions, *, tokenizer: Tokenizer | None = None, control: ControlIds | None = None
    ) -> None:
        """``tokenizer``: the model's (None: the V4 vocabulary); ``control``: the ids the parser
        acts on (None: the DeepSeek markers of ``tokenizer``)."""
        self.options = options
        prefix, rid = _TOOL_ID_PREFIX[options.protocol], options.request_id
        if options.ignore_eos:
            control = (control or ControlIds.for_tokenizer(tokenizer)).without_eos()
        self._parser = OutputParser(
            starts_in_reasoning=options.in_reasoning_at_start,
            stop=options.stop,
            parse_tools=bool(options.tool_names),
            tool_id=lambda i: derived_id(prefix, rid, "tool", i),
            tokenizer=tokenizer,
            control=control,
        )
        self._writer: ProtocolWriter = _WRITERS[options.protocol](options)
        if options.prefill_ids and self._parser.feed(options.prefill_ids):
            raise ValueError("prefill_ids: the prefilled ids must not produce output by themselves")
        self._started = False
        self._finish: Finish | None = None
        self._logprobs = TokenLogprobs(tokenizer) if options.logprobs else None
        self._cached_tokens = options.cached_tokens
        self.completion_tokens = 0

    @property
    def done(self) -> bool:
        """The message is complete (EOS, stop string or ``finish``); stop the engine request."""
        return self._finish is not None

    @property
    def finish_reason(self) -> str:
        """How the message ended (stop, length, tool_calls, ...); "" while it goes on."""
        return self._finish.reason if self._finish is not None else ""

    @property
    def http_status(self) -> int:
        """Status of a non-streamed reply: 200, 500 after an error, 503 after an abort."""
        reason = self._finish.reason if self._finish else None
        return {"error": 500, "abort": 503}.get(reason or "", 200)

    def usage(self) -> Usage:
        o = self.options
        return Usage(
            o.prompt_tokens, self.completion_tokens, self._cached_tokens, self._parser.reasoning_tokens
        )

    def set_cached_tokens(self, n: int) -> None:
        """The prompt tokens the engine reused from the cache (what usage reports from now on;
        set before the first ``feed`` so that an opening event reports it too)."""
        self._cached_tokens = min(max(0, n), self.options.prompt_tokens)

    def _opening(self) -> list[str]:
        if self._started:
            return []
        self._started = True
        return self._writer.start(self.usage())

    def feed(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[float] = (),
        top_logprobs: Sequence[Sequence[tuple[int, float]]] = (),
    ) -> list[str]:
        """SSE pieces for the ids one engine step generated; ``logprobs`` / ``top_logprobs``:
        the engine's, per id (used with ``options.logprobs``)."""
        if self._started and self._logprobs is None and self._finish is None:  # most steps
            self.completion_tokens += len(token_ids)
            events = self._parser.feed(token_ids)
            if not events or type(events[-1]) is not Finish:
                return self._writer.step(events)
            finish = events.pop()
            return self._writer.step(events) + self._end(finish, None, "")
        out = self._opening()
        self.completion_tokens += len(token_ids)
        if self._finish is not None:
            return out
        if self._logprobs is None:
            events: list = self._parser.feed(token_ids)
        else:
            events = self._feed_scored(token_ids, logprobs, top_logprobs)
        finish = events.pop() if events and type(events[-1]) is Finish else None
        out += self._writer.step(events)
        if finish is not None:
            out += self._end(finish, None, "")
        return out

    def _feed_scored(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[float],
        top: Sequence[Sequence[tuple[int, float]]],
    ) -> list:
        """The step's events, fed one id at a time, led by the entries of its content ids."""
        assert self._logprobs is not None
        events: list[OutputEvent] = []
        entries = []
        for i, token in enumerate(token_ids):
            if self._parser.finished:
                break
            if self._parser.takes_as_content(token) and i < len(logprobs):
                entries.append(self._logprobs.entry(token, logprobs[i], top[i] if i < len(top) else ()))
            _merge(events, self._parser.feed([token]))
        return [ContentLogprobs(entries), *events] if entries else events

    def finish(self, reason: EngineFinish, usage: Usage | None = None, message: str = "") -> list[str]:
        """End of generation. ``usage`` overrides the counted usage; ``message`` is the error
        text for ``abort`` / ``error``. Returns [] when the message was already complete."""
        out = self._opening()
        if self._finish is not None:
            return out
        events = self._parser.finish(reason)
        finish = events.pop()
        out += self._writer.step(events)
        return out + self._end(finish, usage, message or _DEFAULT_MESSAGE.get(reason, ""))

    def _end(self, finish: Finish, usage: Usage | None, message: str) -> list[str]:
        self._finish = finish
        return self._writer.end(finish, usage or self.usage(), message)

    def body(self) -> dict[str, Any]:
        """The non-streamed response body (or the protocol's error body)."""
        return self._writer.body()


def _merge(events: list[OutputEvent], more: list[OutputEvent]) -> None:
    """Append ``more``, joining deltas of one kind as a single ``feed`` of the ids would."""
    for e in more:
        last = events[-1] if events else None
        if type(e) in (ReasoningDelta, ContentDelta) and type(last) is type(e):
            last.text += e.text  # type: ignore[union-attr]
        elif type(e) is ToolCallDelta and type(last) is ToolCallDelta and last.index == e.index:
            last.arguments += e.arguments
        else:
            events.append(e)


def collect(
    options: OutputOptions,
    steps: Iterable[Sequence[int]],
    reason: EngineFinish = "stop",
    usage: Usage | None = None,
    *,
    tokenizer: Tokenizer | None = None,
) -> dict[str, Any]:
    """The non-streamed body for a whole generation (``steps``: ids per engine step)."""
    out = OutputStream(options, tokenizer=tokenizer)
    for ids in steps:
        out.feed(ids)
        if out.done:
            break
    out.finish(reason, usage)
    return out.body()
