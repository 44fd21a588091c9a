"""The controller role: instance registry from heartbeats. Planned: autoscaler, drain, failover."""

from dsi.roles.controller.actor import ControllerActor
from dsi.roles.controller.registry import InstanceRegistry

__all__ = ["ControllerActor", "InstanceRegistry"]
