"""Roles <-> controller: heartbeats, the instance registry, drain orders.

Every role instance tells the controller a ``Heartbeat`` each ``cluster.heartbeat_interval_s``;
the first one registers it. ``Goodbye`` on a graceful stop. ``ListInstances`` is what
``dsi status`` asks.
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
    state: str = "ready"  # starting | ready | draining | stopping
    load: Load = Load()
    started_at: float = 0.0  # unix seconds
    http: str = ""  # HOST:PORT for an entrypoint, else ""


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
    state: str  # ready | starting | draining | stopping | suspect | lost | stopped
    load: Load
    last_seen_s: float  # seconds since the last heartbeat
    started_at: float
    http: str = ""


class InstanceTable(Message):
    instances: list[InstanceInfo]
    controller_id: str = ""


class Drain(Message):
    """Operator -> controller: take an instance offline after its grace period."""

    instance_id: str
    grace_s: float = 60.0


ControlMsg = Heartbeat | Goodbye | ListInstances | InstanceTable | InstanceInfo | Drain | Load
CONTROL = (Heartbeat, Goodbye, ListInstances, InstanceInfo, InstanceTable, Drain, Load)
