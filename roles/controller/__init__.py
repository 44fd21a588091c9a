"""The controller role: instance registry and lifecycle from heartbeats, drain orders, the
autoscaler with its ready pool, and with a kubernetes provisioner the StatefulSet scaling that
follows it.

``ControllerActor`` and ``InstanceRegistry`` load on first use (as ``dsi.engine``'s names do): the
engine and gateway roles import only ``lifecycle`` from here, without the actor's provisioners
(aiohttp, kubernetes)."""

from __future__ import annotations

from importlib import import_module
from typing import Any

_HOMES = {"ControllerActor": "actor", "InstanceRegistry": "registry"}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'dsi.roles.controller' has no attribute {name!r}")
    return getattr(import_module(f"dsi.roles.controller.{_HOMES[name]}"), name)
