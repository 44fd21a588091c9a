"""The Gemma 3 family: its config, its checkpoint loader against transformers' Gemma3ForCausalLM
(a tiny seeded checkpoint), and the prefix-hit semantics of its naive reference."""

import json
import os
import random

import pytest
import torch

from dsi.model.family import family_of, load_model_dir
from dsi.model.gemma3 import Gemma3Config
from dsi.model.gemma3_reference import gemma3_logits
from tests.gemma3 import TINY_GEMMA3, tiny_weights
from tests.smollm2 import one_torch_thread

HF_TINY = {
    "model_type": "gemma3_text",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 7,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "query_pre_attn_scalar": 24,
    "sliding_window": 160,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
    "max_position_embeddings": 4096,
}


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


def _tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(512) for _ in range(n)]


def test_config_from_hf_keys():
    cfg = Gemma3Config.from_hf(HF_TINY)
    assert cfg.sliding == (True,) * 5 + (False, True)  # pattern 6 when layer_types is absent
    assert cfg.full_layers == (5,) and cfg.sliding_layers == (0, 1, 2, 3, 4, 6)
    assert (cfg.theta(0), cfg.theta(5)) == (10_000.0, 1_000_000.0)
    assert cfg.ring == 166 and cfg.snapshot_tokens == 160 and cfg.ring_layers == 6
    with pytest.raises(ValueError, match="soft-capping"):
        Gemma3Config.from_hf(HF_TINY | {"attn_logit_softcapping": 50.0})
    with pytest.raises(ValueError, match="rope scaling"):
        Gemma3Config.from_hf(HF_TINY | {"rope_scaling": {"rope_type": "linear", "factor": 8.0}})


def test_logits_equal_transformers_on_a_seeded_checkpoint(tmp_path):
    """A random Gemma3ForCausalLM, saved and loaded back by the family loader: the reference's
    logits equal transformers' over a prompt twice the sliding window (query scale != head_dim)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    model = Gemma3ForCausalLM(Gemma3TextConfig(**HF_TINY, attn_implementation="eager")).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():  # norms start at 0 (scale 1): move them too
            p.copy_(torch.randn_like(p) * (0.1 if "norm" in name else 0.05))
    model.save_pretrained(tmp_path)
    assert family_of(tmp_path) == "gemma3"
    cfg, w = load_model_dir(tmp_path)
    tokens = _tokens(320, 1)
    with torch.no_grad():
        expected = model(torch.tensor([tokens])).logits[0]
    got = gemma3_logits(cfg, w, tokens, from_pos=0)
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=1e-4)


def test_a_hit_within_the_window_replays_everything_and_a_longer_one_cuts_windows():
    """R = max(0, H - window): a hit of H <= window recomputes every position (the hit-free
    logits up to rounding); past it, the replay's cut windows change the logits."""
    w = tiny_weights()
    tokens = _tokens(600, 2)
    free = gemma3_logits(TINY_GEMMA3, w, tokens)
    torch.testing.assert_close(gemma3_logits(TINY_GEMMA3, w, tokens, hit=128), free, atol=1e-5, rtol=1e-5)
    bounded = gemma3_logits(TINY_GEMMA3, w, tokens, hit=512)  # R = 352
    assert (bounded - free).abs().max() > 0.01
    with pytest.raises(ValueError, match="leaving the last prompt token"):
        gemma3_logits(TINY_GEMMA3, w, tokens[:512], hit=512)


def test_family_of_a_gemma3_directory(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma3_text"}))
    assert family_of(tmp_path) == "gemma3"
