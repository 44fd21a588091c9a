"""Which model family a directory holds, and loading it.

    config.json  "family": "llama" or "model_type": "llama"  -> LlamaConfig  (dsi.model.llama)
                 anything else                               -> ModelConfig  (the V4 shape)

Both configs answer ``family``, ``block_size``, ``vocab_size``, ``max_context``, ``eos_id`` and
the cache-shape names the engine reads (``ring``, ``kv_sources``, ``n_producer``, ``keep``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dsi.model.config import ModelConfig
from dsi.model.llama import LlamaConfig, load_llama

AnyConfig = ModelConfig | LlamaConfig


def family_of(directory: Path) -> str:
    data = json.loads((Path(directory) / "config.json").read_text())
    return "llama" if data.get("family") == "llama" or data.get("model_type") == "llama" else "v4"


def load_model_dir(directory: Path) -> tuple[AnyConfig, dict[str, torch.Tensor]]:
    """(config, fp32 weights) of a model directory of any family."""
    if family_of(directory) == "llama":
        return load_llama(directory)
    from dsi.model.weights import load_model

    return load_model(directory)
