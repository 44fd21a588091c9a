"""The entrypoint role: the HTTP API gateway (for now only GET /health)."""

from dsi.roles.entrypoint.actor import EntrypointActor

__all__ = ["EntrypointActor"]
