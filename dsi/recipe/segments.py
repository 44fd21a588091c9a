"""Typed prompt segments: control tokens and content text.

A rendered prompt is a list of segments. A control token is emitted as its id; a run of text
is encoded with the tokenizer that has no added vocabulary, so content can never produce a
control token (see RECIPE.md, "Rendering rule").

    segments  [BOS] "sys text" [USER] "hi" [ASSISTANT] [THINK]
    text      <｜begin▁of▁sentence｜>sys text<｜User｜>hi<｜Assistant｜><think>
    ranges    (0,21)                          (29,37)     (39,52)     (52,59)
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass


class Control(enum.Enum):
    """Control tokens; the value is the token's spelling in the tokenizer's added vocabulary."""

    BOS = "<｜begin▁of▁sentence｜>"
    EOS = "<｜end▁of▁sentence｜>"
    SYSTEM = "<｜System｜>"  # V4.1 only: not in the V4 vocabulary
    USER = "<｜User｜>"
    ASSISTANT = "<｜Assistant｜>"
    LATEST_REMINDER = "<｜latest_reminder｜>"
    THINK = "<think>"
    END_THINK = "</think>"
    DSML = "｜DSML｜"
    IMAGE = "<｜image｜>"  # V4.1 only


Segment = Control | str

_CONTROL_RE = re.compile("|".join(re.escape(c.value) for c in Control))
_BY_SPELLING = {c.value: c for c in Control}


def template(text: str) -> list[Segment]:
    """A trusted template string split at control spellings. Never call it on client text."""
    out: list[Segment] = []
    pos = 0
    for m in _CONTROL_RE.finditer(text):
        if m.start() > pos:
            out.append(text[pos : m.start()])
        out.append(_BY_SPELLING[m.group()])
        pos = m.end()
    if pos < len(text):
        out.append(text[pos:])
    return out


def coalesce(segments: Iterable[Segment]) -> list[Segment]:
    """Adjacent text merged, empty text dropped: each text run is then one encoding unit."""
    out: list[Segment] = []
    for seg in segments:
        if isinstance(seg, str):
            if not seg:
                continue
            if out and isinstance(out[-1], str):
                out[-1] += seg
                continue
        out.append(seg)
    return out


@dataclass(slots=True, frozen=True)
class RenderedPrompt:
    """The prompt as text, where its control tokens are (half-open code-point ranges), and the
    coalesced segments the token ids come from."""

    text: str
    special_ranges: tuple[tuple[int, int], ...]
    segments: tuple[Segment, ...]

    @classmethod
    def from_segments(cls, segments: Iterable[Segment]) -> RenderedPrompt:
        segs = coalesce(segments)
        pieces: list[str] = []
        ranges: list[tuple[int, int]] = []
        pos = 0
        for seg in segs:
            piece = seg if isinstance(seg, str) else seg.value
            if not isinstance(seg, str):
                ranges.append((pos, pos + len(piece)))
            pieces.append(piece)
            pos += len(piece)
        return cls("".join(pieces), tuple(ranges), tuple(segs))
