"""The prefill role: prompt forward for un-cached tokens, KV handoff to decode."""

from dsi.roles.prefill.actor import PrefillActor

__all__ = ["PrefillActor"]
