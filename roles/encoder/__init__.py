"""The encoder role: images -> embeddings for the prefill (model to come)."""

from dsi.roles.encoder.actor import EncoderActor

__all__ = ["EncoderActor"]
