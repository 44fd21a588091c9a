"""``dsi model import-gguf``: a GGUF file -> a Hugging Face style model directory.

    FILE.gguf  --gguf (dequantise)-->  model.safetensors   HF tensor names, [out, in], fp32 or bf16
               --metadata----------->  config.json         HF config keys (+ "family": "llama")
               --tokenizer.ggml.*--->  tokenizer.json (+ tokenizer_config.json)
               --tokenizer.chat_template-> chat_template.jinja

The output is the same kind of directory as a Hugging Face safetensors checkpoint, so one loader
(:func:`dsi.model.llama.load_llama`) reads both, and ``transformers`` can load it too (the
reference for equality tests). Architectures: ``llama`` (read by :mod:`dsi.model.llama`) and
``gemma3`` (text decoder, read by :mod:`dsi.model.gemma3`).

llama.cpp stores llama's Q and K rows permuted for its interleaved rotary layout; :func:`unpermute`
restores the half-split layout of the Hugging Face checkpoints (and of :func:`dsi.model.ops.rope`).
For gemma3 it stores every RMSNorm weight as ``1 + w``; the importer subtracts the 1 again, so
the directory holds the Hugging Face weights.
Building ``tokenizer.json`` from the GGUF vocabulary and merges uses ``transformers``' GGUF
converter, so ``transformers`` is needed to import (not to serve).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

SUPPORTED = ("llama", "gemma3")

# GGUF tensor name (after "blk.{i}.") -> Hugging Face name (after "model.layers.{i}.")
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GEMMA3_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
_GEMMA3_LOCAL_ROPE = 10_000.0  # not in the GGUF metadata; llama.cpp fixes it for gemma3 too
_GEMMA3_PATTERN = 6  # every 6th layer is global (llama.cpp's fixed gemma3 pattern)
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's rotary row permutation of a Q or K projection. w: [heads * D, in]."""
    d = w.shape[0] // heads
    return w.reshape(heads, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_metadata(reader) -> dict[str, object]:
    """Scalar and string fields of a GGUF file (large arrays such as the vocabulary are skipped)."""
    out: dict[str, object] = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and key.rsplit(".", 1)[-1] in (
            "tokens",
            "scores",
            "token_type",
            "merges",
        ):
            continue
        try:
            out[key] = field.contents()
        except Exception:  # a field type the reader cannot decode is not one this importer needs
            continue
    return out


def hf_config(meta: dict[str, object], tied: bool) -> dict[str, object]:
    """config.json of a supported GGUF (Hugging Face config keys of its architecture)."""
    arch = meta["general.architecture"]
    if arch not in SUPPORTED:
        raise ValueError(f"GGUF architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED)})")

    def get(key: str, default: object = None) -> object:
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise ValueError(f"GGUF metadata has no {arch}.{key}")
        return value

    if arch == "gemma3":
        return _gemma3_config(meta, get)

    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "family": "llama",
        "name": str(meta.get("general.name", "llama")),
        "vocab_size": int(get("vocab_size")),
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": int(get("rope.dimension_count", hidden // heads)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(get("rope.freq_base", 10_000.0)),
        "max_position_embeddings": int(get("context_length")),
        "tie_word_embeddings": tied,
        "bos_token_id": int(meta.get("tokenizer.ggml.bos_token_id", 1)),
        "eos_token_id": int(meta.get("tokenizer.ggml.eos_token_id", 2)),
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
    }


def _gemma3_config(meta: dict[str, object], get) -> dict[str, object]:
    """config.json of a ``gemma3`` GGUF (Hugging Face Gemma3TextConfig keys)."""
    if meta.get("gemma3.rope.scaling.type") not in (None, "none"):
        raise ValueError("gemma3 rope scaling is not supported")
    n = int(get("block_count"))
    head_dim = int(get("attention.key_length"))
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "name": str(meta.get("general.name", "gemma3")),
        "vocab_size": int(meta.get("gemma3.vocab_size") or 0) or None,
        "hidden_size": int(get("embedding_length")),
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": n,
        "num_attention_heads": int(get("attention.head_count")),
        "num_key_value_heads": int(get("attention.head_count_kv")),
        "head_dim": head_dim,
        "query_pre_attn_scalar": head_dim,
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(get("rope.freq_base")),
        "rope_local_base_freq": _GEMMA3_LOCAL_ROPE,
        "sliding_window": int(get("attention.sliding_window")),
        "layer_types": [
            "full_attention" if (i + 1) % _GEMMA3_PATTERN == 0 else "sliding_attention" for i in range(n)
        ],
        "max_position_embeddings": int(get("context_length")),
        "tie_word_embeddings": True,
        "bos_token_id": int(meta.get("tokenizer.ggml.bos_token_id", 2)),
        "eos_token_id": int(meta.get("tokenizer.ggml.eos_token_id", 1)),
        "pad_token_id": int(meta.get("tokenizer.ggml.padding_token_id", 0)),
        "hidden_activation": "gelu_pytorch_tanh",
        "attention_bias": False,
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
        "torch_dtype": "float32",
    }


def dequantised_tensors(reader, cfg: dict[str, object], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every tensor of the file, dequantised, under its Hugging Face name ([out, in] for matrices)."""
    from gguf.quants import dequantize

    gemma = cfg["model_type"] == "gemma3_text"
    layer_names = _GEMMA3_LAYER_NAMES if gemma else _LAYER_NAMES
    out: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        values = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        if gemma and t.name.endswith("norm.weight"):
            values = values - np.float32(1.0)
        if t.name in _TOP_NAMES:
            name = _TOP_NAMES[t.name]
        else:
            blk, layer, rest = t.name.split(".", 2)
            if blk != "blk" or rest not in layer_names:
                raise ValueError(f"unexpected GGUF tensor {t.name!r}")
            name = f"model.layers.{layer}.{layer_names[rest]}"
            if rest == "attn_q.weight" and not gemma:
                values = unpermute(values, int(cfg["num_attention_heads"]))
            elif rest == "attn_k.weight" and not gemma:
                values = unpermute(values, int(cfg["num_key_value_heads"]))
        out[name] = torch.from_numpy(values.copy()).to(dtype)
    return out


def import_gguf(
    path: Path, out: Path, dtype: torch.dtype = torch.float32, tokenizer: bool = True
) -> dict[str, object]:
    """Write ``out`` (config.json, model.safetensors, tokenizer files, chat_template.jinja) from the
    GGUF file ``path``; returns the config written. ``tokenizer=False`` skips the tokenizer files
    (building Gemma's 262K-entry tokenizer takes the converter most of a minute)."""
    from gguf import GGUFReader

    path, out = Path(path), Path(out)
    reader = GGUFReader(str(path))
    meta = read_metadata(reader)
    tied = not any(t.name == "output.weight" for t in reader.tensors)
    cfg = hf_config(meta, tied)
    cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    weights = dequantised_tensors(reader, cfg, dtype)
    if cfg.get("vocab_size") is None:  # gemma3 GGUFs leave it to the embedding's shape
        cfg["vocab_size"] = int(weights["model.embed_tokens.weight"].shape[0])
    out.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    template = meta.get("tokenizer.chat_template")
    if isinstance(template, str):
        (out / "chat_template.jinja").write_text(template)
    if tokenizer:
        _write_tokenizer(path, out)
    return cfg


def _write_tokenizer(path: Path, out: Path) -> None:
    """tokenizer.json and tokenizer_config.json from the GGUF vocabulary (``transformers``' converter)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tok.save_pretrained(str(out))
