"""KvLayout: how one vLLM instance holds a KV block, as its connector found it.

vLLM's CPU build keeps each attention layer's cache as one tensor whose first dimension is the
block (``[num_blocks, num_kv_heads, block_size, 2 * head_size]`` here; a GPU build has its own
per-backend shapes). dsi moves a block as the bytes of ``cache[layer][block]`` of every layer,
in layer order:

    staged file = [block 0: layer 0 bytes | layer 1 bytes | ... ][block 1: ...] ...

so the bytes are portable exactly between instances whose layouts (and vLLM version, model and
dtype) agree; the fingerprint says which those are. The worker half of the connector writes
``layout.json`` into the staging directory once it has the caches; the role reads it.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from dsi.messages.fingerprint import MachineFingerprint

LAYOUT_FILE = "layout.json"


@dataclass(frozen=True, slots=True)
class KvLayout:
    """``block_shape``: one layer's block, ``dtype`` its element type, ``layers`` how many caches;
    ``block_bytes``: one block of every layer (bytes); ``block_size`` in tokens."""

    layers: int
    block_shape: tuple[int, ...]
    dtype: str
    layer_block_bytes: int
    block_size: int
    num_blocks: int

    @property
    def block_bytes(self) -> int:
        return self.layers * self.layer_block_bytes

    def blocks(self, tokens: int) -> int:
        """Blocks that hold ``tokens`` tokens."""
        return math.ceil(tokens / self.block_size)

    def describe(self) -> str:
        return (
            f"{self.num_blocks} KV blocks of {self.block_size} tokens, {self.layers} layers x "
            f"{list(self.block_shape)} {self.dtype} ({self.block_bytes / 2**20:.2f} MiB a block)"
        )

    def write(self, staging: Path) -> None:
        tmp = staging / f".{LAYOUT_FILE}.tmp"
        tmp.write_text(json.dumps(asdict(self)))
        tmp.replace(staging / LAYOUT_FILE)

    @classmethod
    def read(cls, staging: Path) -> KvLayout:
        """The layout the connector wrote; FileNotFoundError when vLLM did not load it."""
        raw = json.loads((staging / LAYOUT_FILE).read_text())
        return cls(**{**raw, "block_shape": tuple(raw["block_shape"])})

    def engine_tag(self, version: str, model: str, dtype: str) -> str:
        """What, beside the machine, decides these KV bytes (the fingerprint's ``engine``)."""
        shape = "x".join(str(d) for d in self.block_shape)
        return f"vllm {version} model={model} dtype={dtype} kv={self.dtype}[{shape}] block={self.block_size}"

    def fingerprint(
        self, machine: MachineFingerprint, version: str, model: str, dtype: str
    ) -> MachineFingerprint:
        return machine.with_engine(self.engine_tag(version, model, dtype))
