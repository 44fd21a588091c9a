"""Frozen schema: messages as protocol version 2 defined them, to play a peer one version back.

Copies, field for field, of the structs that changed in version 3 (TokenChunk gained ``seq``,
Heartbeat gained ``protocol``), and of the rest of their message family as it was; nested types
that did not change are the current ones. Never edit these to follow the current messages: that
they differ is the point.
"""

from __future__ import annotations

from dsi.engine.hit_policy import HitChoice, HitPolicy
from dsi.engine.params import SamplingParams
from dsi.messages.base import Message
from dsi.messages.control import Load
from dsi.messages.fingerprint import MachineFingerprint
from dsi.messages.version import Protocol

VERSION_2 = Protocol(version=2, oldest=2)
"""A process of version 2 as released: it accepted frames of version 2 only."""


class ImageSpan(Message):
    offset: int
    tokens: int
    digest: bytes


class Generate(Message):
    request_id: str
    token_ids: list[int]
    sampling: SamplingParams = SamplingParams()
    traffic_class: str = "chatbot"
    cached_tokens: int = 0
    hit_policy: HitPolicy | None = None
    pin_hit: HitChoice | None = None
    images: list[ImageSpan] = []
    encoder: str = ""
    delivered: list[int] = []


class TokenChunk(Message):
    request_id: str
    token_ids: list[int]
    finish: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    logprobs: list[float] = []
    top_logprobs: list[list[tuple[int, float]]] = []
    hit: HitChoice | None = None
    moved_to: str = ""


class Abort(Message):
    request_id: str
    reason: str = "client disconnected"


class Heartbeat(Message):
    instance_id: str
    role: str
    host: str
    pid: int
    address: str
    state: str = "ready"
    load: Load = Load()
    started_at: float = 0.0
    http: str = ""
    assigned: str = ""
    fingerprint: MachineFingerprint | None = None


GATEWAY = (Generate, TokenChunk, Abort)
FROZEN = (*GATEWAY, Heartbeat)
