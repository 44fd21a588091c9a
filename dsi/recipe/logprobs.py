"""Per-token logprobs as the OpenAI APIs report them.

The engine reports each generated id's logprob and, when asked, the most likely ids at that
position as (id, logprob) pairs. Chat Completions (``logprobs.content``) and Responses
(``output_text.logprobs``) list them as::

    {"token": "Hello", "logprob": -0.31, "bytes": [72, 101, 108, 108, 111],
     "top_logprobs": [{"token": "Hello", "logprob": -0.31, "bytes": [72, 101, 108, 108, 111]}, ...]}

``token`` is the id's bytes decoded as UTF-8, with U+FFFD where an id holds only part of a
character (``bytes`` are exact and join across ids); a special id has its own spelling. A
logprob below -9999 (an id a constraint forbids) is reported as -9999.0, OpenAI's "very
unlikely".

Which ids are listed, the same in a stream and in its body: the ids the model generated in the
content section, one entry each, in order - from the first id after ``</think>`` (or the first
id, without thinking) up to the id that ends the content: EOS and the ``｜DSML｜`` id that
opens a tool call are not listed (the ``<`` before it, which is ordinary text, is), and neither is
anything after a stop string (the id that completes it is). Reasoning ids are not listed: the
APIs have no place for their logprobs, and OpenAI's reasoning models do not report them either.
Tool-call ids are not listed. A stream attaches an entry to the first content delta (Chat) or
``output_text.delta`` (Responses) written after its id was generated, or to the end of the
message when no more content comes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer

from dsi.recipe.detok import byte_table
from dsi.tokenizer import load_tokenizer

LOWEST = -9999.0


@dataclass(slots=True)
class ContentLogprobs:
    """An output event: entries of content ids generated in this step (before its deltas)."""

    entries: list[dict[str, Any]]


class TokenLogprobs:
    """Builds the entries of one vocabulary (the V4 tokenizer unless another is given)."""

    def __init__(self, tokenizer: Tokenizer | None = None) -> None:
        self._tokenizer = tokenizer or load_tokenizer()
        self._table = byte_table(tokenizer)

    def entry(self, token_id: int, logprob: float, top: Sequence[tuple[int, float]]) -> dict[str, Any]:
        return {**self._token(token_id, logprob), "top_logprobs": [self._token(i, lp) for i, lp in top]}

    def _token(self, token_id: int, logprob: float) -> dict[str, Any]:
        data = self._table[token_id] if 0 <= token_id < len(self._table) else b""
        if data:
            text = data.decode("utf-8", "replace")
        else:  # a special id (EOS...): its spelling
            text = self._tokenizer.id_to_token(token_id) or ""
            data = text.encode("utf-8")
        return {"token": text, "logprob": max(float(logprob), LOWEST), "bytes": list(data)}
