"""Roles <-> controller: heartbeats, the instance registry, lifecycle orders.

Every role instance asks the controller a ``Heartbeat`` each ``cluster.heartbeat_interval_s``;
the first one registers it, and each is answered with an ``Assignment``: the lifecycle state the
controller holds for it, which the next heartbeats carry back (``assigned``) so that a restarted
controller rebuilds its table from them. ``Goodbye`` on a graceful stop. ``ListInstances`` is
what ``dsi status`` and the gateway ask; ``SetState`` is an operator's order (drain). ``GetScale`` is what ``dsi status`` and ``dsi serve``
(which starts and stops instances for the targets) ask, ``SetScale`` is ``dsi scale``.
An engine instance's heartbeats carry its ``MachineFingerprint`` (dsi.engine.fingerprint), which
``InstanceInfo`` passes on, so that ``dsi status`` can tell when a role's instances compute apart.
"""

from __future__ import annotations

import msgspec

from dsi.messages.base import Message
from dsi.messages.fingerprint import MachineFingerprint


class StepCurveView(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """A DSpark decode engine's step-time curve (dsi.engine.step_curve) as ``dsi status`` shows it:
    ``step_ms[b][l]`` ms per step of ``batches[b]`` sequences x ``lengths[l]`` tokens each (1: a
    plain decode, 2..6: the last token and 1..5 drafts), plus ``draft_ms[b]`` for the proposals."""

    batches: list[int]
    lengths: list[int]
    step_ms: list[list[float]]
    draft_ms: list[float]


class Load(Message):
    """An instance's load as the controller's table shows it and the autoscaler reads it: counts,
    not rates (the controller takes the rate of a counter between two heartbeats). Balancers get
    the engines' LoadReport instead (dsi.messages.balancer)."""

    running: int = 0  # requests being served
    queued: int = 0  # requests waiting for admission
    kv_tokens: int = 0  # tokens of KV held by running requests
    inbox: int = 0  # messages waiting in the actor's inbox
    uncached_tokens: int = 0  # prompt tokens admitted without a prefix hit since the process started
    queued_pixels: int = 0  # encoder: image pixels waiting or being encoded
    # Expert parallelism (dsi.eplb): ranks serving in the instance's EP group and ranks configured;
    # fewer serving than configured (failed devices at start) is reduced capacity. 0 = no EP group.
    ep_ranks: int = 0
    ep_configured: int = 0
    # Speculative decoding of a decode engine ([engine] speculative): the mode ("" when off), the
    # step-time curve a dspark engine measured at start-up, the acceptance rate of each draft
    # position so far (-1.0: not verified yet with every draft before it accepted).
    speculative: str = ""
    step_curve: StepCurveView | None = None
    accept_rates: tuple[float, ...] = ()

    def capacity_share(self) -> float:
        """Share of the configured capacity this instance serves with (1.0 without EP)."""
        return self.ep_ranks / self.ep_configured if self.ep_configured else 1.0


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
    # An engine instance's compute environment (prefill, decode; None for other roles and before
    # its engine is built): instances with different digests may compute different bits.
    fingerprint: MachineFingerprint | None = None
    # The sender's PROTOCOL_VERSION (dsi.messages.version); a sender of version 2 predates the field.
    protocol: int = 2


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
    fingerprint: MachineFingerprint | None = None  # from its last heartbeat (engine instances)
    protocol: int = 2  # from its last heartbeat: the instance's protocol version


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


class GetScale(Message):
    """Operator or provisioner -> controller: answered with a ScaleStatus."""


class SetScale(Message):
    """Operator -> controller (``dsi scale``): hold `role` at `instances` serving, within its
    [min_instances, max_instances]; -1 hands the role back to the autoscaler. Answered with a
    ScaleStatus, or InvalidRequest (autoscaling off, role not scaled, count out of bounds)."""

    role: str
    instances: int


class ScaleRole(Message):
    """One scaled role as the controller holds it now. Counts are instances.

    ``wanted`` is how many should exist (serving, ready, starting and draining back to the pool):
    whoever holds a provisioner starts instances of the role until that many run, and stops the
    ones named in ``stop`` (taken out of service and idle, drained for too long, or ready above
    the pool target). ``demand`` and ``capacity`` are in the role's unit: un-cached prompt
    tokens/s for prefill, active requests for decode.
    """

    role: str
    min_instances: int
    max_instances: int
    ready_pool: int  # configured pool size
    serving: int
    ready: int
    starting: int  # registered as starting, draining back to the pool, or started and not seen yet
    draining: int  # taken out of service, to be stopped
    target: int  # serving count wanted by the last decision (min_instances before the first)
    pool_target: int
    wanted: int
    demand: float = 0.0
    capacity: float = 0.0
    manual: int = -1  # an operator's target (dsi scale), -1 = autoscaled
    stop: list[str] = []


class ScaleDecision(Message):
    """One role's part of one autoscaler decision, with the inputs it was made from."""

    at: float  # unix seconds
    role: str
    serving: int
    ready: int
    starting: int
    demand: float
    capacity: float
    need: int
    target: int
    take: int = 0  # ready -> serving
    returned: int = 0  # serving -> drained back to the ready pool
    stop_serving: int = 0  # serving -> drained, then stopped
    stop_ready: int = 0
    start: int = 0
    pool_target: int = 0
    reasons: list[str] = []


class ScaleStatus(Message):
    """The autoscaler's state: off (``enabled`` False) or its roles and last decisions, oldest
    first (up to 100 decisions, one entry per scaled role each)."""

    enabled: bool
    interval_s: float = 0.0
    quota_threshold: float = 0.0
    roles: list[ScaleRole] = []
    decisions: list[ScaleDecision] = []


class Undrain(Message):
    """Operator -> controller: cancel a drain during its grace period; the instance serves again.
    IllegalTransition once the grace period is over (the instance is moving its work away)."""

    instance_id: str


ControlMsg = (
    Heartbeat
    | Assignment
    | Goodbye
    | ListInstances
    | InstanceTable
    | InstanceInfo
    | TransitionCount
    | SetState
    | Drain
    | Undrain
    | Load
    | GetScale
    | SetScale
    | ScaleRole
    | ScaleDecision
    | ScaleStatus
)
CONTROL = (
    Heartbeat,
    Assignment,
    Goodbye,
    ListInstances,
    InstanceInfo,
    InstanceTable,
    TransitionCount,
    SetState,
    Drain,
    Undrain,
    Load,
    GetScale,
    SetScale,
    ScaleRole,
    ScaleDecision,
    ScaleStatus,
)
