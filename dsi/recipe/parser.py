"""Cross-chunk output parser: generated token ids -> reasoning, content and DSML tool calls.

Markers are recognised from token ids, never from re-encoded text: ``<think>`` (128821),
``</think>`` (128822), EOS (1) and ``｜DSML｜`` (128825) are single control ids, and a tool-call
tag is ``<`` or ``</``, the DSML id, then the tag text. DSML spelled with ordinary tokens is
plain text. Both spellings are accepted (V4 ``tool_calls``/``invoke``/``parameter``, V4.1 with a
leading space and `` calls``):

    <｜DSML｜tool_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜tool_calls>

gives ``ToolCallStart(0, id, "get_weather")`` and argument fragments that join to
``{"city": "Paris", "days": 3}``. States::

    REASONING --</think>--> CONTENT --"<" DSML--> TOOLS --</...tool_calls>--> DONE
        |                     |                     |                        |
        +--------- EOS, stop string (content only), finish() ------------> FINISHED

Held back, and nothing else: an incomplete UTF-8 character; a trailing run of newlines (they
are dropped before ``</think>`` and before a tool-call block) and a trailing ``<`` in content;
the longest content suffix that starts a stop string; a trailing ``<`` or ``</`` inside a
string parameter value; an unfinished tag; a ``string="false"`` value (it is released whole,
once it is known to be valid JSON). Leading newlines of reasoning and of content are dropped.

Decisions on malformed or cut output:
- A block that goes wrong before its first ``invoke`` (a bad tag, anything but whitespace
  between tags, a DSML id without ``<``) is content: its text is released as is, at once.
- Once a call started, stray text between tags is ignored; a bad tag closes the call and
  ends the block, and the rest of the output is ignored.
- Text after the block is ignored (the model is trained to end the turn there).
- A call cut by ``finish()`` (length, abort, error) or by EOS is closed so that its arguments
  stay a JSON object: a string value is closed, a non-string value is taken as it stands
  (as a string when it is not valid JSON), and ``ToolCallEnd.complete`` is False.
- A ``string="false"`` value that is not valid JSON becomes a JSON string.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from tokenizers import Tokenizer

from dsi.recipe.detok import IncrementalDetokenizer

NO_ID = -1  # an id no token has: a control the parser must never act on

FinishReason = Literal["stop", "stop_sequence", "length", "tool_calls", "abort", "error"]
EngineFinish = Literal["stop", "length", "abort", "error"]


@dataclass(slots=True)
class ReasoningDelta:
    text: str


@dataclass(slots=True)
class ContentDelta:
    text: str


@dataclass(slots=True)
class ToolCallStart:
    index: int
    id: str
    name: str


@dataclass(slots=True)
class ToolCallDelta:
    """A fragment of the call's arguments, a JSON object text."""

    index: int
    arguments: str


@dataclass(slots=True)
class ToolCallEnd:
    index: int
    arguments: str  # the whole JSON object text
    complete: bool  # False when the call was cut (length, abort, error, EOS inside the call)


@dataclass(slots=True)
class Finish:
    reason: FinishReason
    stop_sequence: str | None = None


OutputEvent = ReasoningDelta | ContentDelta | ToolCallStart | ToolCallDelta | ToolCallEnd | Finish


@dataclass(frozen=True, slots=True)
class ControlIds:
    """Ids the parser acts on; ``dropped`` are template tokens that never reach the text."""

    eos: int = 1
    think: int = 128821
    end_think: int = 128822
    dsml: int = 128825
    dropped: frozenset[int] = frozenset({0, 128803, 128804, 128828})

    def without_eos(self) -> ControlIds:
        """The same ids with EOS dropped from the text instead of ending the message (a request
        with ``ignore_eos``)."""
        return replace(self, eos=NO_ID, dropped=self.dropped | {self.eos})

    @classmethod
    def for_tokenizer(cls, tok: Tokenizer | None) -> ControlIds:
        """The DeepSeek markers of ``tok`` (None: the V4 vocabulary's)."""
        return cls() if tok is None else cls.from_tokenizer(tok)

    @classmethod
    def from_tokenizer(cls, tok: Tokenizer) -> ControlIds:
        def tid(spelling: str) -> int:
            i = tok.token_to_id(spelling)
            if i is None:
                raise ValueError(f"tokenizer has no control token {spelling!r}")
            return i

        dropped = {tid(s) for s in ("<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>")}
        dropped.add(tid("<｜latest_reminder｜>"))
        return cls(
            tid("<｜end▁of▁sentence｜>"), tid("<think>"), tid("</think>"), tid("｜DSML｜"), frozenset(dropped)
        )


def random_tool_id(index: int) -> str:
    return f"call_{secrets.token_hex(12)}"


DSML_TEXT = "｜DSML｜"
_REASONING, _CONTENT, _TOOLS, _DONE, _FINISHED = range(5)
_BLOCK_NAMES = ("tool_calls", "calls")
_BLOCK_OPEN_FORMS = ("tool_calls>", " tool_calls>", "calls>", " calls>")
_INVOKE_RE = re.compile(r' ?invoke\s+name="([^"]*)"\s*')
_PARAM_RE = re.compile(r' ?parameter\s+name="([^"]*)"\s+string="(true|false)"\s*')
_MAX_TAG = 1024


def _escape(text: str) -> str:
    """JSON string body of ``text``; escaping is per character, so fragments escape alone."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _reject_constant(name: str) -> float:
    raise ValueError(name)


def json_value(raw: str) -> str:
    """A ``string="false"`` value as JSON text: itself when valid JSON, else a JSON string."""
    text = raw.strip()
    try:
        json.loads(text, parse_constant=_reject_constant)
    except ValueError:
        return json.dumps(raw, ensure_ascii=False)
    return text


def _trailing(text: str, char: str) -> int:
    return len(text) - len(text.rstrip(char))


class OutputParser:
    """Token ids of one generated message -> ``OutputEvent`` lists, one list per step.

    ``feed`` returns the events of one engine step, with adjacent deltas of one kind merged;
    after EOS or a stop string it returns ``Finish`` and ignores later ids. ``finish`` ends the
    message on the engine's word and releases everything held back.
    """

    def __init__(
        self,
        *,
        starts_in_reasoning: bool,
        stop: Sequence[str] = (),
        parse_tools: bool = True,
        tool_id: Callable[[int], str] = random_tool_id,
        tokenizer: Tokenizer | None = None,
        control: ControlIds | None = None,
    ) -> None:
        self._detok = IncrementalDetokenizer(tokenizer)
        if control is None:
            control = ControlIds.for_tokenizer(tokenizer)
        self._ctrl = control
        c = self._ctrl
        self._ctrl_set = frozenset({c.eos, c.think, c.end_think, c.dsml, *c.dropped})
        self._stop = tuple(stop)
        self._parse_tools = parse_tools
        self._tool_id = tool_id
        self._state = _REASONING if starts_in_reasoning else _CONTENT
        self._started = False  # first non-newline text of the current section seen
        self._held = ""
        self._block: _ToolBlock | None = None
        self._events: list[OutputEvent] = []
        self.tool_calls = 0
        self.reasoning_tokens = 0

    @property
    def finished(self) -> bool:
        return self._state == _FINISHED

    @property
    def in_reasoning(self) -> bool:
        return self._state == _REASONING

    def takes_as_content(self, token_id: int) -> bool:
        """Whether ``token_id``, fed next, is text of the content section: the parser is in
        content (not reasoning, a tool-call block, or past the end) and it is no control id."""
        return self._state == _CONTENT and token_id not in self._ctrl_set

    def feed(self, token_ids: Sequence[int]) -> list[OutputEvent]:
        """Events of one engine step (``token_ids``: the ids generated in it)."""
        if self._state == _FINISHED or not token_ids:
            return []
        self._events = events = []
        if self._ctrl_set.isdisjoint(token_ids):
            state = self._state
            if state == _CONTENT and self._started and not (self._held or self._stop or self._parse_tools):
                # Plain content with nothing held back (most steps): what _content would emit.
                text = self._detok.feed(token_ids)
                if text:
                    events.append(ContentDelta(text))
                return events
            if state == _REASONING:
                self.reasoning_tokens += len(token_ids)
                if self._started:  # reasoning text after its start: what _reasoning would emit
                    text = self._detok.feed(token_ids)
                    if text:
                        text = self._held + text
                        hold = _trailing(text, "\n")
                        self._held = text[-hold:] if hold else ""
                        if hold:
                            text = text[:-hold]
                        if text:
                            events.append(ReasoningDelta(text))
                    return events
            self._text(self._detok.feed(token_ids))
            return events
        start = 0
        for i, t in enumerate(token_ids):
            if t not in self._ctrl_set:
                continue
            self._run(token_ids[start:i])
            self._text(self._detok.flush())
            if self._state == _FINISHED:  # a stop string in the text before
                return events
            self._control(t)
            start = i + 1
            if self._state == _FINISHED:
                return events
        self._run(token_ids[start:])
        return events

    def finish(self, reason: EngineFinish) -> list[OutputEvent]:
        """End the message: the engine stopped (``stop``), hit max_tokens (``length``), was
        aborted or failed. Flushes held-back text and closes a cut tool call."""
        if self._state == _FINISHED:
            return []
        self._events = events = []
        self._end(reason)
        return events

    # -- steps --------------------------------------------------------------------------------

    def _run(self, ids: Sequence[int]) -> None:
        if ids:
            if self._state == _REASONING:
                self.reasoning_tokens += len(ids)
            self._text(self._detok.feed(ids))

    def _control(self, t: int) -> None:
        c = self._ctrl
        state = self._state
        if t == c.eos:
            self._end("stop")
        elif t == c.end_think:
            if state == _REASONING:
                self._held = ""  # newlines before </think> are dropped
                self._state, self._started = _CONTENT, False
        elif t == c.think:
            if state == _CONTENT and not self._started and not self._held:
                self._state = _REASONING
        elif t == c.dsml:
            self._dsml()

    def _dsml(self) -> None:
        if self._state == _TOOLS:
            assert self._block is not None
            self._block.dsml()
        elif self._state == _CONTENT and self._parse_tools and self._held.endswith("<"):
            held, self._held = self._held, ""
            self._emit_text(ContentDelta, held[:-1].rstrip("\n"))
            self._state = _TOOLS
            self._block = _ToolBlock(self, held + DSML_TEXT)
        elif self._state != _DONE:
            self._text(DSML_TEXT)

    def _text(self, text: str) -> None:
        if not text:
            return
        state = self._state
        if state == _CONTENT:
            self._content(text)
        elif state == _REASONING:
            self._reasoning(text)
        elif state == _TOOLS:
            assert self._block is not None
            self._block.text(text)

    def _reasoning(self, text: str) -> None:
        text = self._begin(text)
        if text is None:
            return
        self._release(ReasoningDelta, text, _trailing(text, "\n"))

    def _content(self, text: str) -> None:
        text = self._begin(text)
        if text is None:
            return
        if self._stop and self._match_stop(text):
            return
        hold = 0
        if self._parse_tools:
            lt = 1 if text.endswith("<") else 0
            hold = lt + _trailing(text[: len(text) - lt], "\n")
        if self._stop:
            hold = max(hold, self._stop_prefix(text))
        self._release(ContentDelta, text, hold)

    def _begin(self, text: str) -> str | None:
        """Held-back text plus ``text``; leading newlines of the section are dropped (None: all were)."""
        if not self._started:
            text = text.lstrip("\n")
            if not text:
                return None
            self._started = True
        return self._held + text

    def _release(self, kind: type, text: str, hold: int) -> None:
        """Emit ``text`` but its last ``hold`` characters, which wait for the next step."""
        if hold:
            self._held = text[-hold:]
            text = text[:-hold]
        else:
            self._held = ""
        self._emit_text(kind, text)

    def _match_stop(self, text: str) -> bool:
        # The stop string that completes first wins (then the one that starts first): the
        # order in which a stream sees them complete, whatever its chunking.
        best: tuple[int, int] | None = None
        found = ""
        for s in self._stop:
            i = text.find(s)
            if i >= 0 and (best is None or (i + len(s), i) < best):
                best, found = (i + len(s), i), s
        if best is None:
            return False
        self._held = ""
        self._emit_text(ContentDelta, text[: best[1]])
        self._events.append(Finish("stop_sequence", found))
        self._state = _FINISHED
        return True

    def _stop_prefix(self, text: str) -> int:
        best = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best

    def _end(self, reason: EngineFinish) -> None:
        self._text(self._detok.flush())
        if self._state == _TOOLS:
            assert self._block is not None
            self._block.cut()
        if self._state == _FINISHED:  # released text held a stop string
            return
        cut = self._state == _TOOLS
        held, self._held = self._held, ""
        if self._state == _REASONING:
            self._emit_text(ReasoningDelta, held)
        elif self._state == _CONTENT:
            self._emit_text(ContentDelta, held)
        if reason in ("abort", "error"):
            final: FinishReason = reason
        elif reason == "length" and (cut or not self.tool_calls):
            final = "length"
        else:
            final = "tool_calls" if self.tool_calls else "stop"
        self._state = _FINISHED
        self._events.append(Finish(final))

    # -- used by _ToolBlock --------------------------------------------------------------------

    def _emit_text(self, cls: type[ReasoningDelta] | type[ContentDelta], text: str) -> None:
        if not text:
            return
        events = self._events
        if events and type(events[-1]) is cls:
            events[-1].text += text  # type: ignore[union-attr]
        else:
            events.append(cls(text))

    def _emit_args(self, index: int, text: str) -> None:
        events = self._events
        last = events[-1] if events else None
        if type(last) is ToolCallDelta and last.index == index:
            last.arguments += text
        else:
            events.append(ToolCallDelta(index, text))

    def _block_fallback(self, raw: str) -> None:
        """A block that was not one after all: its text is content."""
        self._state, self._block = _CONTENT, None
        self._content(raw)

    def _block_done(self) -> None:
        self._state, self._block = _DONE, None


class _ToolBlock:
    """Inside ``<DSML tool_calls> ... </DSML tool_calls>``.

    ``mode`` is TAG (text after a DSML id, up to ``>``), GAP (between tags; only the last two
    characters matter: ``<`` or ``</`` before the next DSML id) or VALUE (a parameter value).
    ``level`` says which tags may come next.
    """

    TAG, GAP, VALUE = range(3)
    OPEN, TOP, INVOKE, PARAM = range(4)

    def __init__(self, parser: OutputParser, raw: str) -> None:
        self.p = parser
        self.raw: str | None = raw  # text of the block until its first invoke, for fallback
        self.mode, self.level, self.closing = self.TAG, self.OPEN, False
        self.buf = ""  # tag text; the last two characters of a gap or of a value
        self.value: list[str] = []  # a string="false" value so far
        self.index = -1  # current call, -1 between calls
        self.args: list[str] = []
        self.first_param = True
        self.string_value = True

    def text(self, text: str) -> None:
        if self.raw is not None:
            self.raw += text
        self._consume(text)

    def _consume(self, text: str) -> None:
        if self.mode == self.VALUE:
            self._value(text)
        elif self.mode == self.GAP:
            if self.raw is not None and text.strip(" \t\r\n</"):
                self._malformed()  # not a block after all: release it now, not at the end
                return
            self.buf = (self.buf + text)[-2:]
        else:
            self.buf += text
            end = self.buf.find(">")
            if end < 0:
                if len(self.buf) > _MAX_TAG or (
                    self.level == self.OPEN and not any(f.startswith(self.buf) for f in _BLOCK_OPEN_FORMS)
                ):
                    self._malformed()
                return
            tag, rest = self.buf[:end], self.buf[end + 1 :]
            self.buf = ""
            if self._tag(tag) and rest and self.p._block is self:
                self._consume(rest)

    def dsml(self) -> None:
        if self.raw is not None:
            self.raw += DSML_TEXT
        if self.mode == self.GAP and self.buf.endswith(("<", "</")):
            self.mode, self.closing, self.buf = self.TAG, self.buf.endswith("</"), ""
        elif self.mode == self.VALUE and self.buf.endswith("</"):
            self._close_value(closing_tag=True)
            self.mode, self.closing = self.TAG, True
        else:
            self._malformed()

    def _tag(self, tag: str) -> bool:
        """Act on one complete tag (``>`` stripped); False when it is malformed."""
        p, name = self.p, tag[1:] if tag.startswith(" ") else tag
        if self.level == self.OPEN and not self.closing and name in _BLOCK_NAMES:
            self.level = self.TOP
        elif self.level == self.TOP and self.closing and name in _BLOCK_NAMES:
            p._block_done()
            return True
        elif self.level == self.TOP and not self.closing and (m := _INVOKE_RE.fullmatch(tag)):
            self.raw = None
            self.index = p.tool_calls
            p.tool_calls += 1
            p._events.append(ToolCallStart(self.index, p._tool_id(self.index), m.group(1)))
            self.args, self.first_param = [], True
            self._args("{")
            self.level = self.INVOKE
        elif self.level == self.INVOKE and not self.closing and (m := _PARAM_RE.fullmatch(tag)):
            self.string_value = m.group(2) == "true"
            sep = "" if self.first_param else ", "
            self.first_param = False
            self._args(f"{sep}{json.dumps(m.group(1), ensure_ascii=False)}: " + '"' * self.string_value)
            self.level, self.mode = self.PARAM, self.VALUE
            return True
        elif self.level == self.INVOKE and self.closing and name == "invoke":
            self._end_call(complete=True)
            self.level = self.TOP
        elif self.level == self.PARAM and self.closing and name == "parameter":
            self.level = self.INVOKE
        else:
            self._malformed()
            return False
        self.mode = self.GAP
        return True

    def _value(self, text: str) -> None:
        if not self.string_value:  # released whole at the closing tag
            self.value.append(text)
            self.buf = (self.buf + text)[-2:]
            return
        buf = self.buf + text
        keep = len(buf) - (2 if buf.endswith("</") else 1 if buf.endswith("<") else 0)
        if keep:
            self._args(_escape(buf[:keep]))
        self.buf = buf[keep:]

    def _close_value(self, closing_tag: bool) -> None:
        if self.string_value:
            self._args(_escape(self.buf[:-2] if closing_tag else self.buf) + '"')
        else:
            raw = "".join(self.value)
            self._args(json_value(raw[:-2] if closing_tag else raw))
        self.buf, self.value = "", []

    def _args(self, text: str) -> None:
        self.args.append(text)
        self.p._emit_args(self.index, text)

    def _end_call(self, complete: bool) -> None:
        self._args("}")
        self.p._events.append(ToolCallEnd(self.index, "".join(self.args), complete))
        self.index = -1

    def _malformed(self) -> None:
        if self.raw is not None:
            self.p._block_fallback(self.raw)
            return
        self.cut()
        self.p._block_done()

    def cut(self) -> None:
        """The message ends inside the block: a call in progress is closed, incomplete."""
        if self.raw is not None:
            self.p._block_fallback(self.raw)
            return
        if self.index >= 0:
            if self.mode == self.VALUE:
                self._close_value(closing_tag=False)
            self._end_call(complete=False)
