"""The decode role: continuous batching, speculative decoding, KV persistence (engine to come)."""

from dsi.roles.decode.actor import DecodeActor

__all__ = ["DecodeActor"]
