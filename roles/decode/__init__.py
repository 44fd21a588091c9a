"""The decode role: continuous batching over imported (or colocated) prompts, KV persistence."""

from dsi.roles.decode.actor import DecodeActor

__all__ = ["DecodeActor"]
