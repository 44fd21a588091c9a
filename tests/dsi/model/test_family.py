"""A model directory's family comes from its config.json."""

import json

import pytest

from dsi.model.config import ModelConfig
from dsi.model.family import family_of, load_model_dir
from dsi.model.weights import init_weights, save_model


def test_family_of_config_keys(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert family_of(tmp_path) == "llama"
    (tmp_path / "config.json").write_text(json.dumps({"family": "llama", "model_type": "x"}))
    assert family_of(tmp_path) == "llama"


def test_a_v4_directory_loads_as_the_v4_shape(tmp_path):
    small = ModelConfig(
        name="small",
        vocab_size=512,
        hidden=32,
        n_layers=2,
        n_producer=1,
        kv_sources=(0,),
        n_heads=2,
        head_dim=16,
        n_experts=2,
        top_k=1,
        expert_dim=16,
        shared_dim=16,
    )
    save_model(tmp_path, small, init_weights(small))
    assert family_of(tmp_path) == "v4"
    cfg, w = load_model_dir(tmp_path)
    assert cfg == small and cfg.family == "v4" and w["embed"].shape == (512, 32)


def test_a_llama_directory_without_weights_is_an_error(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "vocab_size": 16,
                "hidden_size": 8,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "intermediate_size": 16,
            }
        )
    )
    with pytest.raises(ValueError, match=r"no \*\.safetensors"):
        load_model_dir(tmp_path)
