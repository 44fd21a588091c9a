"""Roles <-> controller: heartbeats, the instance registry, lifecycle orders.

Every role instance asks the controller a ``Heartbeat`` each ``cluster.heartbeat_interval_s``;
the first one registers it, and each is answered with an ``Assignment``: the lifecycle state the
controller holds for it, which the next heartbeats carry back (``assigned``) so that a restarted
controller rebuilds its table from them. ``Goodbye`` on a graceful stop. ``ListInstances`` is
what ``dsi status`` and the gateway ask; ``SetState`` is an operator's order (drain).
"""

from __future__ import annotations

from dsi.messages.base import Message


class Load(Message):
    """An instance's load as the controller's table shows it (and, once they exist, balancers and
    the autoscaler read it): counts, not rates."""

    running: int = 0  # requests being served
    queued: int = 0  # requests waiting for admission
    kv_tokens: int = 0  # tokens of KV held by running requests
    inbox: int = 0  # messages waiting in the actor's inbox


class Heartbeat(Message):
    instance_id: str
    role: str
    host: str
    pid: int
    address: str  # control-plane endpoint of the instance
    state: str = "ready"  # the process's own state: starting | ready | stopping
    load: Load = Load()
    started_at: float = 0.0  # unix seconds
    http: str = ""  # HOST:PORT for an entrypoint, else ""
    assigned: str = ""  # the last lifecycle state a controller assigned ("" = none yet)


class Assignment(Message):
    """Controller -> instance, the answer to a Heartbeat: its lifecycle state
    (starting | ready | serving | draining | stopped | dead)."""

    state: str


class Goodbye(Message):
    instance_id: str
    reason: str = "stopped"


class ListInstances(Message):
    role: str = ""  # "" = every role


class InstanceInfo(Message):
    instance_id: str
    role: str
    host: str
    pid: int
    address: str
    state: str  # lifecycle: starting | ready | serving | draining | stopped | dead
    load: Load
    last_seen_s: float  # seconds since the last heartbeat
    started_at: float
    http: str = ""
    suspect: bool = False  # heartbeats late (2.5 intervals) but not yet for the timeout


class TransitionCount(Message):
    """How many times instances of `role` moved `before` -> `after` ("none": registrations)."""

    role: str
    before: str
    after: str
    count: int


class InstanceTable(Message):
    instances: list[InstanceInfo]
    controller_id: str = ""
    transitions: list[TransitionCount] = []  # since this controller started


class SetState(Message):
    """Operator -> controller: move an instance to `state` (today: draining); answered with its
    InstanceInfo, or IllegalTransition / InvalidRequest."""

    instance_id: str
    state: str
    reason: str = "operator"


class Drain(Message):
    """Operator -> controller: take an instance offline after its grace period (seconds); answered
    with its InstanceInfo (``draining``). A decode moves its running requests with their KV to
    other decodes at the end of it, a prefill finishes its work; then the instance stops."""

    instance_id: str
    grace_s: float = 60.0


class Undrain(Message):
    """Operator -> controller: cancel a drain during its grace period; the instance serves again.
    IllegalTransition once the grace period is over (the instance is moving its work away)."""

    instance_id: str


ControlMsg = (
    Heartbeat | Assignment | Goodbye | ListInstances | InstanceTable | InstanceInfo | TransitionCount
    | SetState | Drain | Undrain | Load
)
CONTROL = (
    Heartbeat, Assignment, Goodbye, ListInstances, InstanceInfo, InstanceTable, TransitionCount,
    SetState, Drain, Undrain, Load,
)
