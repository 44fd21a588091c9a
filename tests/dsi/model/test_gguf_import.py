"""dsi model import-gguf: the dequantised directory is a checkpoint both dsi and transformers load."""

import json

import numpy as np
import pytest
import torch

from dsi.model.gguf_import import unpermute
from dsi.model.llama import LlamaConfig, llama_logits, load_llama
from tests.smollm2 import chat_ids, one_torch_thread


def _llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """What llama.cpp's converter does to Q / K rows (its convert_hf_to_gguf.py)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_unpermute_inverts_the_converter_permutation():
    w = np.arange(6 * 8 * 5, dtype=np.float32).reshape(6 * 8, 5)
    assert np.array_equal(unpermute(_llama_cpp_permute(w, 6), 6), w)
    assert not np.array_equal(_llama_cpp_permute(w, 6), w)


def test_imported_directory_holds_config_tokenizer_and_template(smollm2_dir):
    data = json.loads((smollm2_dir / "config.json").read_text())
    cfg = LlamaConfig.from_hf(data)
    assert (cfg.n_layers, cfg.hidden, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (30, 576, 9, 3, 64)
    assert cfg.vocab_size == 49152 and cfg.tied and data["family"] == "llama"
    assert "<|im_start|>" in (smollm2_dir / "chat_template.jinja").read_text()
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(smollm2_dir / "tokenizer.json"))
    assert tok.decode(tok.encode("The capital of France is Paris.").ids) == "The capital of France is Paris."
    assert tok.token_to_id("<|im_end|>") == 2


def test_reference_forward_matches_transformers_on_the_same_weights(smollm2_dir):
    from transformers import AutoModelForCausalLM

    ids = chat_ids(smollm2_dir, "What is the capital of France?")
    model = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32).eval()
    cfg, w = load_llama(smollm2_dir)
    with torch.no_grad(), one_torch_thread():
        theirs = model(torch.tensor([ids])).logits[0]
        ours = llama_logits(cfg, w, ids)
    assert torch.allclose(ours, theirs, atol=2e-3, rtol=0)
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


def test_a_non_llama_config_is_refused():
    with pytest.raises(ValueError, match="model_type"):
        LlamaConfig.from_hf({"model_type": "gemma3"})
