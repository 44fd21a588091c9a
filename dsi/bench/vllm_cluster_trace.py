"""The workload of ``dsi bench vllm-cluster``: a slice of Mooncake's conversation trace, scaled to
SmolLM2's 4,096-token context and a machine of two slow cores.

Each trace line holds ``input_length``, ``output_length`` and ``hash_ids``, ids of 512-token
prefix blocks: two requests that share their first k ids share k * 512 prompt tokens. Nearly
every request starts with id 0 (a common system prompt), so sharing that counts starts at the
second id. What :func:`workload` makes of it (:class:`Scaling` holds the numbers):

- **slice**: the trace is walked in order; a request whose first ``min_shared_ids`` ids or more
  equal an earlier request's is taken together with that earlier request (the first one that
  had the prefix), until ``requests`` are taken; they are replayed in trace order;
- **prompt**: each id becomes ``tokens_per_id`` words (a 1 / (512 / tokens_per_id) scale), word
  j of id h chosen by a hash of (h, j) from the SmolLM2 tokens that are a space and 3 to 10
  lower-case letters (:func:`vocabulary_words`), joined by spaces, so that each word is one
  token and equal ids give equal tokens: two prompts share exactly their shared ids' tokens
  (plus the chat template's, equal for all). Only the first ``max_prompt_tokens //
  tokens_per_id`` ids are kept;
- **output**: ``min(output_length, max_output_tokens)`` tokens, EOS ignored.

Text, not token ids: dsi's gateway serves Chat Completions, Responses and Messages, no
``/v1/completions``, so both sides get the same one-turn chat and tokenize it with the same
tokenizer and template (the result compares the prompt tokens each side reports).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

TRACE_BLOCK = 512  # tokens per hash id in the trace
_WORD = re.compile(r"Ġ[a-z]{3,10}")  # a byte-level BPE token: a space and a lower-case word


@dataclass(slots=True, frozen=True)
class Scaling:
    """How the trace is cut down; see the module docstring."""

    requests: int = 32
    tokens_per_id: int = 64
    max_prompt_tokens: int = 2048
    max_output_tokens: int = 24
    min_shared_ids: int = 2

    def __post_init__(self) -> None:
        for name in ("requests", "tokens_per_id", "max_output_tokens", "min_shared_ids"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_prompt_tokens < self.tokens_per_id:
            raise ValueError(
                f"max_prompt_tokens ({self.max_prompt_tokens}) holds no id of {self.tokens_per_id} tokens"
            )

    @property
    def max_ids(self) -> int:
        return self.max_prompt_tokens // self.tokens_per_id


@dataclass(slots=True, frozen=True)
class TraceRow:
    """One trace line (``timestamp_ms`` since the trace's start)."""

    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


@dataclass(slots=True, frozen=True)
class BenchRequest:
    """One request of the replay: its trace line, the ids its prompt keeps, the prompt text,
    ``max_tokens`` and ``shared_ids``: its leading ids that an earlier request of the slice had."""

    trace_index: int
    hash_ids: tuple[int, ...]
    text: str
    max_tokens: int
    shared_ids: int


def read_trace(path: Path, limit: int = 0) -> list[TraceRow]:
    """The trace's lines in file order (the first ``limit``; all when 0)."""
    rows = []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            rows.append(
                TraceRow(row["timestamp"], row["input_length"], row["output_length"], tuple(row["hash_ids"]))
            )
            if limit and len(rows) >= limit:
                break
    return rows


def select(rows: list[TraceRow], scaling: Scaling) -> list[int]:
    """Indexes into ``rows`` of the slice, ascending: each request sharing ``min_shared_ids`` or
    more leading ids with an earlier one, with the first request that had that prefix."""
    first: dict[tuple[int, ...], int] = {}  # a prefix -> the first row that had it
    taken: set[int] = set()
    for i, row in enumerate(rows):
        ids = row.hash_ids
        source = next(
            (first[ids[:k]] for k in range(len(ids), scaling.min_shared_ids - 1, -1) if ids[:k] in first),
            None,
        )
        for k in range(1, len(ids) + 1):
            first.setdefault(ids[:k], i)
        if source is None:
            continue
        new = {source, i} - taken
        if len(taken) + len(new) > scaling.requests:
            continue  # a later request whose source is taken may still fit
        taken |= new
        if len(taken) == scaling.requests:
            break
    return sorted(taken)


def vocabulary_words(tokenizer_json: Path) -> tuple[str, ...]:
    """The words (sorted) whose space-prefixed form is one token of a byte-level BPE tokenizer."""
    vocab = json.loads(Path(tokenizer_json).read_text())["model"]["vocab"]
    return tuple(sorted(token[1:] for token in vocab if _WORD.fullmatch(token)))


def id_words(hash_id: int, count: int, words: tuple[str, ...]) -> list[str]:
    """The ``count`` words that stand for trace id ``hash_id`` (the same on every call)."""
    out = []
    for j in range(count):
        digest = hashlib.blake2b(f"{hash_id}.{j}".encode(), digest_size=8).digest()
        out.append(words[int.from_bytes(digest, "little") % len(words)])
    return out


def prompt_text(hash_ids: tuple[int, ...], scaling: Scaling, words: tuple[str, ...]) -> str:
    return " ".join(w for h in hash_ids for w in id_words(h, scaling.tokens_per_id, words))


def workload(rows: list[TraceRow], scaling: Scaling, words: tuple[str, ...]) -> list[BenchRequest]:
    """The slice of ``rows`` as requests, in trace order (see the module docstring)."""
    seen: set[tuple[int, ...]] = set()
    out = []
    for i in select(rows, scaling):
        ids = rows[i].hash_ids[: scaling.max_ids]
        shared = max((k for k in range(1, len(ids) + 1) if ids[:k] in seen), default=0)
        seen.update(ids[:k] for k in range(1, len(ids) + 1))
        max_tokens = max(1, min(rows[i].output_length, scaling.max_output_tokens))
        out.append(BenchRequest(i, ids, prompt_text(ids, scaling, words), max_tokens, shared))
    return out


def describe(requests: list[BenchRequest], rows: list[TraceRow], scaling: Scaling, trace: Path) -> dict:
    """What the slice is, for the result: its size, where it came from, how it was scaled."""
    words = [len(r.hash_ids) * scaling.tokens_per_id for r in requests]
    shared = sum(r.shared_ids * scaling.tokens_per_id for r in requests)
    return {
        "trace": str(trace),
        "requests": len(requests),
        "trace_lines_spanned": requests[-1].trace_index + 1 if requests else 0,
        "selection": (
            f"in trace order, each request sharing >= {scaling.min_shared_ids} leading hash ids "
            "with an earlier one, with the first request that had that prefix"
        ),
        "tokens_per_hash_id": scaling.tokens_per_id,
        "scale": f"1/{TRACE_BLOCK // scaling.tokens_per_id} (one {TRACE_BLOCK}-token id -> "
        f"{scaling.tokens_per_id} one-token words)",
        "max_prompt_words": scaling.max_prompt_tokens,
        "prompts_capped": sum(len(rows[r.trace_index].hash_ids) > len(r.hash_ids) for r in requests),
        "max_output_tokens": scaling.max_output_tokens,
        "mean_prompt_words": round(sum(words) / len(words), 1) if words else 0.0,
        "output_tokens": sum(r.max_tokens for r in requests),
        # the most a prefix cache could skip: words in ids an earlier request of the slice had
        "shared_word_fraction": round(shared / sum(words), 3) if words else 0.0,
    }


def fixed_batch(
    streams: int, prompt_words: int, max_tokens: int, words: tuple[str, ...], salt: int = 0
) -> list[BenchRequest]:
    """``streams`` prompts of ``prompt_words`` words that share no word run with each other or
    with the trace (ids from 2**40 up), ``max_tokens`` each; another ``salt``, another batch."""
    base = (1 << 40) + salt * streams
    return [
        BenchRequest(-1, (base + i,), " ".join(id_words(base + i, prompt_words, words)), max_tokens, 0)
        for i in range(streams)
    ]


def computed_floor(
    requests: list[BenchRequest], scaling: Scaling, template_tokens: int, block_size: int
) -> float:
    """Prompt tokens per request that a perfect prefix cache would still compute: one that holds
    every full ``block_size``-token block of every earlier request of the slice when a request
    arrives (the chat template's ``template_tokens`` lead every prompt; the last prompt token is
    always computed). No cache of such blocks can do better on this slice."""
    computed = 0
    for i, r in enumerate(requests):
        tokens = template_tokens + len(r.hash_ids) * scaling.tokens_per_id
        shared = template_tokens + r.shared_ids * scaling.tokens_per_id if i else 0
        computed += tokens - min(shared, tokens - 1) // block_size * block_size
    return round(computed / len(requests), 1) if requests else 0.0
