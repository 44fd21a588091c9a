"""The controller role: instance registry and lifecycle from heartbeats, drain orders, the
autoscaler with its ready pool, and with a kubernetes provisioner the StatefulSet scaling that
follows it.

``ControllerActor`` and ``InstanceRegistry`` load on first use: the engine and gateway roles
import only ``lifecycle`` from here, without the actor's provisioners (aiohttp, kubernetes)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dsi.roles.controller.actor import ControllerActor
    from dsi.roles.controller.registry import InstanceRegistry

__all__ = ["ControllerActor", "InstanceRegistry"]


def __getattr__(name: str) -> Any:
    if name == "ControllerActor":
        from dsi.roles.controller.actor import ControllerActor

        return ControllerActor
    if name == "InstanceRegistry":
        from dsi.roles.controller.registry import InstanceRegistry

        return InstanceRegistry
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
