"""Which model family a directory holds, and loading it.

    config.json  "family": "llama" or "model_type": "llama"  -> LlamaConfig   (dsi.model.llama)
                 "model_type": "gemma3_text"                 -> Gemma3Config  (dsi.model.gemma3)
                 anything else                               -> ModelConfig   (the V4 shape)

Every config answers ``family``, ``block_size``, ``vocab_size``, ``max_context``, ``eos_id`` and
the cache-shape names the engine reads (``ring``, ``ring_layers``, ``kv_sources``, ``n_producer``,
``snapshot_tokens``, ``keep``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dsi.model.config import ModelConfig
from dsi.model.gemma3 import Gemma3Config, load_gemma3
from dsi.model.llama import LlamaConfig, load_llama

AnyConfig = ModelConfig | LlamaConfig | Gemma3Config


def family_of(directory: Path) -> str:
    data = json.loads((Path(directory) / "config.json").read_text())
    if data.get("family") == "llama" or data.get("model_type") == "llama":
        return "llama"
    return "gemma3" if data.get("model_type") == "gemma3_text" else "v4"


def load_model_dir(directory: Path) -> tuple[AnyConfig, dict[str, torch.Tensor]]:
    """(config, fp32 weights) of a model directory of any family."""
    family = family_of(directory)
    if family == "llama":
        return load_llama(directory)
    if family == "gemma3":
        return load_gemma3(directory)
    from dsi.model.weights import load_model

    return load_model(directory)
