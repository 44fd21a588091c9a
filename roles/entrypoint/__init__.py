"""The entrypoint role: the HTTP API gateway."""

from dsi.roles.entrypoint.actor import EntrypointActor

__all__ = ["EntrypointActor"]
