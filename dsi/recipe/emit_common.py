"""What every protocol emitter shares: the options, usage counts, SSE framing and ids.

An emitter turns parser events into one protocol's wire format. It is driven by
``dsi.recipe.emit_stream.OutputStream``; each protocol module holds one ``ProtocolWriter``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, Protocol

import msgspec

from dsi.recipe.logprobs import ContentLogprobs
from dsi.recipe.parser import Finish, OutputEvent

ProtocolName = Literal["chat", "responses", "messages"]
ModelVersion = Literal["V4", "V4.1"]
PROTOCOLS: tuple[ProtocolName, ...] = ("chat", "responses", "messages")
_ENCODER = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class OutputOptions:
    """Everything the output side needs from a resolved request.

    ``request_id`` is the id the response reports (``chatcmpl-...``, ``resp_...``, ``msg_...``);
    item and tool-call ids derive from it. ``created`` is unix seconds. ``thinking`` says whether
    the request runs in thinking mode; ``starts_in_reasoning`` whether the prompt ended with
    ``<think>`` (None: same as ``thinking``; a prefix continuation of the answer sets False).
    ``tool_names`` are the declared tools: DSML tool calls are parsed only when there is one.
    ``stop`` applies to content only. ``include_usage`` is Chat Completions'
    ``stream_options.include_usage``. ``prompt_tokens`` / ``cached_tokens`` are counts of the
    encoded prompt and of its prefix-cache hit (``OutputStream.set_cached_tokens`` replaces the
    latter with the engine's count). ``logprobs``: report per-token logprobs (Chat Completions
    ``logprobs``, Responses ``include: ["message.output_text.logprobs"]``; see
    ``dsi.recipe.logprobs``). ``response_fields`` are request settings the
    Responses object echoes (``instructions``, ``tools``, ``temperature``, ...), merged over
    the defaults. ``ignore_eos``: the request's extension field; the engine generates past EOS,
    so EOS ends nothing here either and the message runs to the engine's finish.
    """

    protocol: ProtocolName
    model: str
    request_id: str
    created: int
    thinking: bool = True
    starts_in_reasoning: bool | None = None
    model_version: ModelVersion = "V4"
    tool_names: tuple[str, ...] = ()
    stop: tuple[str, ...] = ()
    include_usage: bool = False
    prompt_tokens: int = 0
    cached_tokens: int = 0
    response_fields: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    # Ids the prompt ended with that belong to the output's syntax (a tool-call block opener
    # prefilled for tool_choice required / named): parsed first, never emitted or counted.
    prefill_ids: tuple[int, ...] = ()
    logprobs: bool = False
    ignore_eos: bool = False  # EOS is dropped from the text instead of ending the message

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol: {self.protocol!r} is not one of {PROTOCOLS}")
        if self.model_version not in ("V4", "V4.1"):
            raise ValueError(f"model_version: {self.model_version!r} is not 'V4' or 'V4.1'")
        if not self.request_id:
            raise ValueError("request_id: must not be empty")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError("stop: every stop string must be a non-empty str")
        if not 0 <= self.cached_tokens <= self.prompt_tokens:
            raise ValueError(
                f"cached_tokens: {self.cached_tokens} is not within [0, prompt_tokens={self.prompt_tokens}]"
            )
        object.__setattr__(self, "tool_names", tuple(self.tool_names))
        object.__setattr__(self, "prefill_ids", tuple(self.prefill_ids))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "response_fields", MappingProxyType(dict(self.response_fields)))

    @property
    def in_reasoning_at_start(self) -> bool:
        return self.thinking if self.starts_in_reasoning is None else self.starts_in_reasoning


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one request."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


StepEvent = OutputEvent | ContentLogprobs


class ProtocolWriter(Protocol):
    """One protocol's wire format over parser events (``Finish`` is given to ``end`` only).
    ``start`` gets the usage known before any output (prompt and cached tokens)."""

    def start(self, usage: Usage) -> list[str]: ...
    def step(self, events: Sequence[StepEvent]) -> list[str]: ...
    def end(self, finish: Finish, usage: Usage, message: str) -> list[str]: ...
    def body(self) -> dict[str, Any]: ...


def to_json(obj: Any) -> str:
    return _ENCODER.encode(obj).decode()


def sse_data(obj: Any) -> str:
    """An unnamed SSE event (Chat Completions)."""
    return f"data: {to_json(obj)}\n\n"


def sse_event(name: str, obj: Any) -> str:
    """A named SSE event (Responses, Messages)."""
    return f"event: {name}\ndata: {to_json(obj)}\n\n"


_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def derived_id(prefix: str, request_id: str, *parts: object, length: int = 24) -> str:
    """A stable id from the request id: ``prefix`` + ``length`` base62 characters.

    Stable so that a stream and its non-streamed twin name their items alike; unique across
    requests as long as request ids are.
    """
    key = ":".join([request_id, *map(str, parts)]).encode()
    n = int.from_bytes(hashlib.blake2b(key, digest_size=32).digest(), "big")
    out = []
    for _ in range(length):
        n, r = divmod(n, 62)
        out.append(_BASE62[r])
    return prefix + "".join(out)
