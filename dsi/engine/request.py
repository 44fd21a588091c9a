"""Request: one sequence's counters and cache handles inside the engine.

The scheduler thinks in counters, not phases: ``num_computed`` catches up with ``num_tokens``
(prompt + output so far). A prefill is simply a request far behind; a decode is one token
behind; a preempted request goes back to ``num_computed = 0`` and recomputes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dsi.engine.params import EOS_ID, SamplingParams
from dsi.engine.prefix import RequestStats

if TYPE_CHECKING:
    import torch

    from dsi.engine.hit_load import HitLoad
    from dsi.engine.images import ImageEmbeds
    from dsi.engine.prefix import CachedPrefix
    from dsi.structured import TokenConstraint


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    consumer_start: int  # fixed at admission: decoder-side replay boundary
    seed: int  # the effective sampling seed (params.seed or drawn at admission)
    arrival: float = 0.0
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    status: Status = Status.WAITING
    num_computed: int = 0
    in_flight: int = 0  # tokens being sampled by a step that has not been processed yet
    verifying: bool = False  # a verify slice of it is in flight (where it continues is not known yet)
    floating: bool = False  # a slice after that verify slice is scheduled; the worker places it
    block_table: list[int] = field(default_factory=list)
    slot: int = -1
    finish_reason: str | None = None
    num_preemptions: int = 0
    block_hashes: list[bytes] = field(default_factory=list)  # chain hash of each full page, in order
    hashed_pages: int = 0  # pages of block_table already registered in the pool under their hash
    prefill_only: bool = False  # stop after the first token and keep the cache for export
    # Prefix hit: pages of positions < num_cached are loaded from ``cached`` on admission (again
    # after a preemption) and computing starts at replay_start: R (bounded replay, the producer
    # SWA start) or H itself (exact hit: the producer rings of [H - 128, H) are loaded too).
    cached: CachedPrefix | None = None
    num_cached: int = 0
    replay_start: int = 0
    hit_load: HitLoad | None = None  # the cached pages' copy, while layers may still wait for it
    # (boundary B, producer rings of [B - 128, B)) at the last block boundary reached, when the
    # engine collects ring snapshots; committed in step order on the CPU, never by the worker.
    ring_snapshot: tuple[int, torch.Tensor] | None = None
    collected_pages: int = 0  # full pages already queued as FullPage (not reset by preemption)
    stats: RequestStats = field(default_factory=RequestStats)
    # Image embeddings of prompt positions (kept until the request leaves: a preemption
    # recomputes with them) and the hash-chain extra keys they give its blocks.
    images: tuple[ImageEmbeds, ...] = ()
    block_extras: dict[int, bytes] = field(default_factory=dict)
    # Structured output (worker-owned once admitted): the constraint has accepted the first
    # ``constraint_pos`` output tokens; it is rebuilt from ``output`` after a preemption.
    constraint: TokenConstraint | None = None
    constraint_pos: int = 0
    constraint_epoch: int = 0  # num_preemptions when the constraint was last built

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def all_tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def exact_hit(self) -> bool:
        """A hit with loaded SWA rings: replay_start == num_cached (a bounded replay has R < H)."""
        return self.num_cached > 0 and self.replay_start == self.num_cached

    @property
    def producer_start(self) -> int:
        """Where producer SWA keys start: R after a bounded replay, 0 otherwise (an exact hit's
        rings hold the true keys before H)."""
        return 0 if self.exact_hit else self.replay_start

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED


def stop_reason(req: Request, token: int, max_context: int, eos_id: int = EOS_ID) -> str | None:
    """Why ``req`` ends after sampling ``token`` (already appended to its output), or None.
    ``eos_id``: the model's end-of-sequence id (the V4 one unless the family has another)."""
    p = req.params
    if (token == eos_id and not p.ignore_eos) or token in p.stop_token_ids:
        return "stop"
    if len(req.output) >= p.max_tokens or req.num_tokens >= max_context:
        return "length"
    if req.prefill_only:
        return "prefilled"
    return None


def constraint_at(position: int, req: Request) -> TokenConstraint | None:
    """Worker: the request's constraint, having accepted the output before ``position``.
    A preempted request's output is complete and stable here (it was preempted with nothing in
    flight), so replaying it rebuilds the state."""
    if req.params.structured is None:
        return None
    from dsi.structured import Rejecting, SpecError, default_compiler

    before = position - len(req.prompt)
    if req.constraint_pos != before or req.constraint_epoch != req.num_preemptions:
        try:
            req.constraint = default_compiler().replay(req.params.structured, req.output[:before])
        except SpecError:
            req.constraint = Rejecting()
        req.constraint_pos, req.constraint_epoch = before, req.num_preemptions
    return req.constraint
