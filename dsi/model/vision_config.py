"""VisionConfig: the shape of a model's vision encoder (dsi.model.vit), without torch, so the
gateway can size image tokens without loading the engine's libraries."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

VISION_CONFIG = "vision.json"
VISION_WEIGHTS = "vision.safetensors"


@dataclass(slots=True, frozen=True)
class VisionConfig:
    lm_hidden: int = 256  # the language model's hidden size (the tiny shape's)
    patch: int = 14  # pixels per patch side
    merge: int = 2  # patches per merged token side (2 x 2 patches -> one token)
    hidden: int = 128
    n_layers: int = 2
    n_heads: int = 4
    mlp_dim: int = 256
    max_pixels: int = 224 * 224  # an image is resized down to at most this many pixels
    norm_eps: float = 1e-6
    seed: int = 1

    def __post_init__(self) -> None:
        if self.hidden % self.n_heads or (self.hidden // self.n_heads) % 4:
            raise ValueError("vision hidden must split into heads whose width is a multiple of 4")
        if min(self.patch, self.merge, self.n_layers, self.lm_hidden, self.mlp_dim) < 1:
            raise ValueError("vision sizes must be positive")
        if self.max_pixels < self.unit * self.unit:
            raise ValueError(f"max_pixels must hold at least one {self.unit} x {self.unit} tile")

    @property
    def unit(self) -> int:
        """Pixels per side of one image token (patch * merge = 28)."""
        return self.patch * self.merge

    def tokens(self, height: int, width: int) -> int:
        """Placeholder tokens of a (resized) image of ``height`` x ``width`` pixels."""
        return (height // self.unit) * (width // self.unit)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> VisionConfig:
        data = json.loads(text)
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown vision config keys: {', '.join(unknown)}")
        return cls(**data)


TINY_VISION = VisionConfig()
VISION_CONFIGS = {"tiny": TINY_VISION}  # the built-in shapes that have a vision encoder


def vision_config_of(shape: str) -> VisionConfig | None:
    """The vision encoder of a built-in model shape (None: a text-only shape)."""
    return VISION_CONFIGS.get(shape)
