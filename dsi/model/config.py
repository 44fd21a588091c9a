"""Model shape of the DeepSeek-V4.1-Flash family, scaled by configuration.

Layer map (``tiny``: 8 main layers, 4 producer + 4 consumer; ``flash``: 40 = 20 + 20)::

    layer:      0     1     2     3   | 4     5     6     7
    half:       producer (self-decoder) | consumer (cross-decoder)
    SWA ring:   yes   yes   yes   yes  | yes   yes   yes   yes     134 tokens each (128 + 6)
    KV source:  -     src   -     src  | boundary: ratio-1 global KV from the producer output
    reads:      -     1     1     3    | global  global  global  global

A producer layer attends to its own SWA window plus the ratio-2 compressed latents of the
nearest KV-source layer at or before it (two tokens pooled into one latent). The consumer half
shares one ratio-1 global latent per token, computed once at the boundary. Every layer has an
MoE FFN (routed top-k + one shared expert).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass(slots=True, frozen=True)
class ModelConfig:
    name: str
    vocab_size: int = 129_280
    hidden: int = 256
    n_layers: int = 8
    n_producer: int = 4  # layers [0, n_producer) are the producer half; the boundary is at n_producer
    kv_sources: tuple[int, ...] = (1, 3)  # producer layers that own compressed global KV
    n_heads: int = 4  # query heads per layer
    head_dim: int = 64  # query / SWA key / latent width
    n_kv_heads: int = 1  # SWA key/value heads (MQA)
    window: int = 128  # SWA window, tokens (including the current one)
    rollback: int = 6  # extra SWA ring slots for speculative rollback
    compress_ratio: int = 2  # producer compressed KV: tokens pooled into one latent
    n_experts: int = 8
    top_k: int = 2
    expert_dim: int = 128  # intermediate width of one routed expert
    shared_dim: int = 128  # intermediate width of the shared expert
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-6
    max_context: int = 16_384  # tokens (prompt + output)
    keep: int = 140  # decoder-side bounded replay: consumer layers see the last `keep` prompt tokens
    block_size: int = 128  # tokens per Block KV page
    # Storage formats (bytes) used for cache accounting; the CPU engine itself runs in fp32.
    latent_bytes: float = 4.0  # per latent value (1 = fp8)
    latent_scale_group: int = 0  # values per fp32 scale (0 = no scales)
    latent_rope_dim: int = 0  # rope part of a latent, stored in bf16 (0 = none)
    index_dim: int = 0  # indexer key width per global entry (fp8 + one fp32 scale); 0 = none
    index_topk: int = 0  # global entries a query attends after the indexer's top-k; 0 = all (dense)
    swa_bytes: float = 4.0  # per SWA key/value element
    seed: int = 0
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = []
        if not 0 < self.n_producer < self.n_layers:
            problems.append("n_producer must split the layers into two non-empty halves")
        if any(not 0 <= s < self.n_producer for s in self.kv_sources) or list(self.kv_sources) != sorted(
            set(self.kv_sources)
        ):
            problems.append("kv_sources must be increasing producer layer indices")
        if not 0 < self.top_k <= self.n_experts:
            problems.append("top_k must be in 1..n_experts")
        if self.keep < self.window + self.rollback:
            problems.append("keep must cover the SWA window plus rollback")
        if self.block_size % self.compress_ratio:
            problems.append("block_size must be a multiple of compress_ratio")
        if self.n_heads % self.n_kv_heads:
            problems.append("n_heads must be a multiple of n_kv_heads")
        if self.head_dim % 2:
            problems.append("head_dim must be even (rotary pairs)")
        if problems:
            raise ValueError(f"model config {self.name!r}: " + "; ".join(problems))

    @property
    def family(self) -> str:
        """The model family (``dsi.model.family``): this shape is the V4 one."""
        return "v4"

    @property
    def eos_id(self) -> int:
        """<｜end▁of▁sentence｜> in the V4 vocabulary."""
        return 1

    @property
    def ring(self) -> int:
        """SWA ring length in tokens (window + rollback)."""
        return self.window + self.rollback

    @property
    def ring_layers(self) -> int:
        """SWA rings per state slot: every layer has a SWA branch."""
        return self.n_layers

    @property
    def snapshot_tokens(self) -> int:
        """Positions of each producer ring in a ring snapshot: one block before the boundary."""
        return self.block_size

    def source_of(self, layer: int) -> int | None:
        """The KV-source layer a producer layer reads (nearest at or before it), or None."""
        sources = [s for s in self.kv_sources if s <= layer]
        return sources[-1] if sources and layer < self.n_producer else None

    def to_json(self) -> str:
        data = asdict(self)
        data["kv_sources"] = list(self.kv_sources)
        return json.dumps(data, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ModelConfig:
        data = json.loads(text)
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown model config keys: {', '.join(unknown)}")
        data["kv_sources"] = tuple(data.get("kv_sources", ()))
        return cls(**data)

    def save(self, directory: Path) -> None:
        (directory / "config.json").write_text(self.to_json() + "\n")

    @classmethod
    def load(cls, directory: Path) -> ModelConfig:
        return cls.from_json((Path(directory) / "config.json").read_text())


TINY = ModelConfig(name="tiny")

# The full-size shape: only for byte / FLOP accounting and simulation, never instantiated.
FLASH = ModelConfig(
    name="flash",
    hidden=5120,
    n_layers=40,
    n_producer=20,
    kv_sources=(2, 8, 14),
    n_heads=64,
    head_dim=256,
    n_kv_heads=1,
    n_experts=384,
    top_k=6,
    expert_dim=1536,
    shared_dim=1536,
    max_context=1_048_576,
    latent_bytes=1.0,  # fp8 latents
    latent_scale_group=64,  # one fp32 scale per 64 values
    latent_rope_dim=32,  # bf16 rope part
    index_dim=32,  # fp8 indexer keys on the ratio-1 global entries
    index_topk=512,  # the indexer keeps 512 global entries per query
    swa_bytes=2.0,  # bf16 SWA rings
)

CONFIGS = {"tiny": TINY, "flash": FLASH}


def get_config(name: str) -> ModelConfig:
    try:
        return CONFIGS[name]
    except KeyError:
        raise ValueError(f"unknown model config {name!r}; choose from {', '.join(CONFIGS)}") from None
