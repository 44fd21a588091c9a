"""The controller role: instance registry and lifecycle from heartbeats. Planned: autoscaler,
drain with migration, failover."""

from dsi.roles.controller.actor import ControllerActor
from dsi.roles.controller.registry import InstanceRegistry

__all__ = ["ControllerActor", "InstanceRegistry"]
