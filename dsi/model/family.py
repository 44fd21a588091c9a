"""Which model family a directory holds, and loading it.

    config.json  "family": "llama" or "model_type": "llama"  -> LlamaConfig  (dsi.model.llama)
                 anything else                               -> ModelConfig  (the V4 shape)

Both configs answer ``family``, ``name``, ``block_size``, ``vocab_size``, ``max_context``,
``eos_id`` and the cache-shape names the engine reads (``ring``, ``kv_sources``, ``n_producer``,
``keep``).

Every role of a cluster serves the model of the node config's ``[model]`` section:
:func:`served_model` makes sure its directory exists (generated or imported from a GGUF file,
see dsi.model.prepare) and gives its config; :func:`load_model_dir` its weights too.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dsi.model.config import ModelConfig, get_config
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


def served_model(directory: Path, shape: str, gguf: str | None = None) -> tuple[Path, AnyConfig]:
    """The directory of the served model (created on first use: imported from ``gguf``, else
    generated from the V4 ``shape``) and its config, without loading the weights."""
    from dsi.model.prepare import ensure_model

    directory = ensure_model(directory, shape, gguf)
    if family_of(directory) == "llama":
        return directory, LlamaConfig.from_hf(json.loads((directory / "config.json").read_text()))
    return directory, ModelConfig.load(directory)


def served_config(directory: Path, shape: str, gguf: str | None = None) -> AnyConfig:
    """The config a role that needs no weights serves by (the gateway's context length and hash
    chain, the balancer's cost model). A V4 shape is known by name; another family's directory
    is read (and imported first when it is missing)."""
    if gguf is None and not (Path(directory) / "config.json").exists():
        return get_config(shape)
    return served_model(directory, shape, gguf)[1]
