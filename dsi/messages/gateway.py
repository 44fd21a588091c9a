"""Entrypoint <-> prefill / decode: generation requests and token streams."""

from __future__ import annotations

from dsi.engine.hit_policy import HitChoice, HitPolicy
from dsi.engine.params import SamplingParams
from dsi.messages.base import Message


class ImageSpan(Message):
    """An image in a prompt: its placeholder tokens are positions [offset, offset + tokens);
    ``digest``: its content hash (16 bytes), how the encoder holding its embeddings names it."""

    offset: int
    tokens: int
    digest: bytes


class Generate(Message):
    """Start a request; the answer is a stream of TokenChunk items."""

    request_id: str
    token_ids: list[int]
    sampling: SamplingParams = SamplingParams()  # resolved by the recipe; carries the cache salt
    traffic_class: str = "chatbot"  # chatbot | agent (selects the KV TTL)
    cached_tokens: int = 0  # leading prompt tokens the kvstore holds, per the entrypoint's CHECK replica
    hit_policy: HitPolicy | None = None  # which prefix hits the prefill may take; None: the cluster's
    # A re-run after tokens reached the client: take this hit (the one the first run took, see
    # dsi.engine.hit_policy.pinned_hit) instead of what the policy would choose now.
    pin_hit: HitChoice | None = None
    images: list[ImageSpan] = []  # image positions of the prompt, in order (see dsi.messages.vision)
    encoder: str = ""  # control address of the encoder that holds their embeddings
    # A re-run: the tokens the client already has. The answer still starts at the first output
    # position (the gateway checks every delivered token again); an engine may compute those
    # positions as part of the prompt instead of decoding them (dsi.roles.vllm.resume).
    delivered: list[int] = []
    # The run of the instance it is sent to (the InstanceInfo.started_at the controller lists,
    # unix seconds), refused by any other run of that instance id (dsi.roles.run_fence); 0: any.
    instance_run: float = 0.0


class TokenChunk(Message):
    """New tokens of one request since the last chunk; ``finish`` is set on the last one.

    ``cached_tokens``: leading prompt tokens the engine loaded from the store instead of
    computing (what usage reports). ``logprobs`` / ``top_logprobs``: one entry per token id,
    when the request asked for them (``SamplingParams.logprobs`` / ``top_logprobs``); a top
    entry lists (id, logprob) pairs, most likely first. ``hit``, on the first chunk only: the
    prefix hit the run took (what a re-run is pinned to). ``finish="migrated"`` (no tokens): the
    request moved off a draining decode; ``moved_to`` names the control address of the decode
    that continues it (``Resume`` there), or is "" when it must be re-run from its prompt.
    ``seq``: the chunk's number in its stream, 1, 2, ... (0: not numbered, a sender that predates
    numbering), by which the gateway sees a chunk lost or repeated on the way."""

    request_id: str
    token_ids: list[int]
    finish: str = ""  # "" | stop | length | abort | error | migrated
    prompt_tokens: int = 0
    cached_tokens: int = 0
    logprobs: list[float] = []
    top_logprobs: list[list[tuple[int, float]]] = []
    hit: HitChoice | None = None
    moved_to: str = ""  # with finish="migrated"
    seq: int = 0  # 1, 2, ... within one stream; 0: not numbered


class Abort(Message):
    request_id: str
    reason: str = "client disconnected"


GatewayMsg = Generate | TokenChunk | Abort
GATEWAY = (Generate, TokenChunk, Abort)
