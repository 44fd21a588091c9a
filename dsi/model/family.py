"""Which model family a directory holds, and loading it.

    config.json  "family": "llama" or "model_type": "llama"  -> LlamaConfig   (dsi.model.llama)
                 "model_type": "gemma3_text"                 -> Gemma3Config  (dsi.model.gemma3)
                 anything else                               -> ModelConfig   (the V4 shape)

Every config answers ``family``, ``name``, ``block_size``, ``vocab_size``, ``max_context``,
``eos_id`` and the cache-shape names the engine reads (``ring``, ``ring_layers``,
``kv_sources``, ``n_producer``, ``snapshot_tokens``, ``keep``).

Every role of a cluster serves the model of the node config's ``[model]`` section:
:func:`served_model` makes sure its directory exists (generated or imported from a GGUF file,
see dsi.model.prepare) and gives its config; :func:`load_model_dir` its weights too. The family
modules (and torch) are imported only when a directory of theirs is read: a gateway or balancer
serving the V4 shape never loads torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from dsi.model.config import ModelConfig, get_config

if TYPE_CHECKING:  # annotations only: the family modules import torch
    from typing import TypeAlias

    import torch

    from dsi.model.gemma3 import Gemma3Config
    from dsi.model.llama import LlamaConfig

    AnyConfig: TypeAlias = ModelConfig | LlamaConfig | Gemma3Config


def family_of(directory: Path) -> str:
    data = json.loads((Path(directory) / "config.json").read_text())
    if data.get("family") == "llama" or data.get("model_type") == "llama":
        return "llama"
    return "gemma3" if data.get("model_type") == "gemma3_text" else "v4"


def load_model_dir(directory: Path) -> tuple[AnyConfig, dict[str, torch.Tensor]]:
    """(config, fp32 weights) of a model directory of any family."""
    family = family_of(directory)
    if family == "llama":
        from dsi.model.llama import load_llama

        return load_llama(directory)
    if family == "gemma3":
        from dsi.model.gemma3 import load_gemma3

        return load_gemma3(directory)
    from dsi.model.weights import load_model

    return load_model(directory)


def served_model(directory: Path, shape: str, gguf: str | None = None) -> tuple[Path, AnyConfig]:
    """The directory of the served model (created on first use: imported from ``gguf``, else
    generated from the V4 ``shape``) and its config, without loading the weights."""
    from dsi.model.prepare import ensure_model

    directory = ensure_model(directory, shape, gguf)
    family = family_of(directory)
    if family == "v4":
        return directory, ModelConfig.load(directory)
    if family == "llama":
        from dsi.model.llama import LlamaConfig as hf_config
    else:
        from dsi.model.gemma3 import Gemma3Config as hf_config
    return directory, hf_config.from_hf(json.loads((directory / "config.json").read_text()))


def served_config(directory: Path, shape: str, gguf: str | None = None) -> AnyConfig:
    """The config a role that needs no weights serves by (the gateway's context length and hash
    chain, the balancer's cost model). A V4 shape is known by name; another family's directory
    is read (and imported first when it is missing)."""
    if gguf is None and not (Path(directory) / "config.json").exists():
        return get_config(shape)
    return served_model(directory, shape, gguf)[1]
