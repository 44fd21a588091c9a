"""What a balancer sees of an instance: one immutable load snapshot, and the error when no
instance can take a request.

A snapshot is built by whoever drives the policy (a role from heartbeats, the simulator from
its own state); the policies only read it. Units are tokens, requests and pixels, counted at the
moment the snapshot was taken.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from dsi.errors import DsiError, register_error

Role = Literal["prefill", "decode", "encoder"]
State = Literal["serving", "draining"]
ROLES: tuple[Role, ...] = ("prefill", "decode", "encoder")
STATES: tuple[State, ...] = ("serving", "draining")


@register_error
class NoInstance(DsiError):
    """No serving instance of the role can take the request (none serving, or all full)."""

    code = "no_instance"


@dataclass(slots=True, frozen=True, kw_only=True)
class InstanceLoad:
    """One instance's load. A draining instance finishes what it holds and takes nothing new."""

    id: str
    role: Role
    state: State = "serving"
    # prefill, and a decode that computes its requests' prompts itself (no prefill instance in the
    # cluster): un-cached prompt tokens routed to it and not yet computed
    queued_tokens: int = 0
    queued_pixels: int = 0  # encoder: pixels of images routed to it and not yet encoded
    running_requests: int = 0  # requests it holds (decode: requests with KV on it)
    kv_tokens: int = 0  # decode: KV tokens its running requests hold
    max_requests: int = 0  # decode capacity: requests it can batch (0 for other roles)
    kv_capacity_tokens: int = 0  # decode capacity: KV tokens it can hold (0 for other roles)

    def __post_init__(self) -> None:
        problems = []
        if not self.id:
            problems.append("id must not be empty")
        if self.role not in ROLES:
            problems.append(f"role must be one of {', '.join(ROLES)}, not {self.role!r}")
        if self.state not in STATES:
            problems.append(f"state must be one of {', '.join(STATES)}, not {self.state!r}")
        for name in (
            "queued_tokens",
            "queued_pixels",
            "running_requests",
            "kv_tokens",
            "max_requests",
            "kv_capacity_tokens",
        ):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0")
        if self.role == "decode" and (self.max_requests <= 0 or self.kv_capacity_tokens <= 0):
            problems.append("a decode instance needs max_requests > 0 and kv_capacity_tokens > 0")
        if problems:
            raise ValueError(f"instance {self.id!r}: " + "; ".join(problems))

    @property
    def serving(self) -> bool:
        return self.state == "serving"


def serving(instances: Sequence[InstanceLoad], role: Role) -> list[InstanceLoad]:
    """The serving instances of ``role``, ordered by id (every policy breaks ties by id)."""
    return sorted((i for i in instances if i.role == role and i.serving), key=lambda i: i.id)
