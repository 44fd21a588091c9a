"""Entrypoint <-> prefill / decode: generation requests and token streams."""

from __future__ import annotations

from dsi.engine.hit_policy import HitPolicy
from dsi.messages.base import Message
from dsi.structured.spec import StructuredSpec


class Sampling(Message):
    """Sampling options as the engine takes them (already resolved by the recipe)."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    seed: int | None = None
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    logprobs: int = 0  # top logprobs per token; 0 = none
    structured: StructuredSpec | None = None  # output constraint (JSON, regex, tool call)


class Generate(Message):
    """Start a request; the answer is a stream of TokenChunk items."""

    request_id: str
    token_ids: list[int]
    sampling: Sampling = Sampling()
    cache_salt: str = ""
    traffic_class: str = "chatbot"  # chatbot | agent (selects the KV TTL)
    cached_tokens: int = 0  # leading prompt tokens the kvstore holds, per the entrypoint's CHECK replica
    hit_policy: HitPolicy | None = None  # which prefix hits the prefill may take; None: the cluster's


class TokenChunk(Message):
    """New tokens of one request since the last chunk; ``finish`` is set on the last one."""

    request_id: str
    token_ids: list[int]
    finish: str = ""  # "" | stop | length | abort | error
    prompt_tokens: int = 0
    cached_tokens: int = 0
    logprobs: list[float] = []


class Abort(Message):
    request_id: str
    reason: str = "client disconnected"


GatewayMsg = Generate | TokenChunk | Abort | Sampling
GATEWAY = (Generate, TokenChunk, Abort, Sampling)
