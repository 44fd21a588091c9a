"""The encoder role. Planned: images -> embeddings for the prefill; today it has no model and encodes
nothing."""

from dsi.roles.encoder.actor import EncoderActor

__all__ = ["EncoderActor"]
