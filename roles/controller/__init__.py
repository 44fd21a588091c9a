"""The controller role: instance registry and lifecycle from heartbeats, the autoscaler with its
ready pool, and with a kubernetes provisioner the StatefulSet scaling that follows it.
Planned: drain with migration, failover."""

from dsi.roles.controller.actor import ControllerActor
from dsi.roles.controller.registry import InstanceRegistry

__all__ = ["ControllerActor", "InstanceRegistry"]
