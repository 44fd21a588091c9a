"""Prefill and decode roles whose engine is vLLM (``engine = "vllm"``, see dsi.vllm)."""

from dsi.roles.vllm.decode import VllmDecodeActor
from dsi.roles.vllm.prefill import VllmPrefillActor

__all__ = ["VllmDecodeActor", "VllmPrefillActor"]
