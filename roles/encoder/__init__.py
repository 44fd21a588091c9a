"""The encoder role: images -> embeddings (a small ViT), batched across requests, sent to the
prefills over the data plane."""

from dsi.roles.encoder.actor import EncoderActor

__all__ = ["EncoderActor"]
