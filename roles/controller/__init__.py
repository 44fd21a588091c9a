"""The controller role: instance registry from heartbeats (autoscaler, drain, failover later)."""

from dsi.roles.controller.actor import ControllerActor
from dsi.roles.controller.registry import InstanceRegistry

__all__ = ["ControllerActor", "InstanceRegistry"]
