import json
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from dsi.cli.main import main
from dsi.model.config import FLASH, TINY, ModelConfig
from dsi.model.flops import prefill_flops
from dsi.model.weights import init_weights, load_model, param_count, save_model


def test_config_json_round_trip_and_validation():
    assert ModelConfig.from_json(TINY.to_json()) == TINY
    with pytest.raises(ValueError, match="unknown model config keys"):
        ModelConfig.from_json(json.dumps({"name": "x", "bogus": 1}))
    with pytest.raises(ValueError, match="keep must cover"):
        replace(TINY, keep=100)
    with pytest.raises(ValueError, match="kv_sources"):
        replace(TINY, kv_sources=(5,))


def test_layer_map():
    assert [TINY.source_of(i) for i in range(8)] == [None, 1, 1, 3, None, None, None, None]
    assert [FLASH.source_of(i) for i in (0, 1, 2, 7, 8, 19, 20)] == [None, None, 2, 2, 8, 14, None]


def test_seeded_init_save_and_load(tmp_path):
    cfg = replace(TINY, vocab_size=1000, seed=3)
    a, b = init_weights(cfg), init_weights(cfg)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert sum(t.numel() for t in a.values()) == param_count(cfg)
    save_model(tmp_path, cfg, a)
    cfg2, loaded = load_model(tmp_path)
    assert cfg2 == cfg and all(torch.equal(a[k], loaded[k]) for k in a)
    other = init_weights(replace(cfg, seed=4))
    assert not torch.equal(a["embed"], other["embed"])


def test_load_rejects_wrong_shapes(tmp_path):
    cfg = replace(TINY, vocab_size=1000)
    w = init_weights(cfg)
    w["layers.0.wq"] = w["layers.0.wq"][:, :10].contiguous()
    save_model(tmp_path, cfg, w)
    with pytest.raises(ValueError, match=r"layers\.0\.wq has shape"):
        load_model(tmp_path)


def test_bounded_replay_nearly_halves_long_prefill_flops():
    ratios = [
        prefill_flops(FLASH, n, FLASH.keep).total / prefill_flops(FLASH, n, None).total
        for n in (1024, 8192, 32768)
    ]
    assert ratios[0] > ratios[1] > ratios[2] > 0.49
    assert ratios[2] < 0.52
    assert prefill_flops(FLASH, 100, FLASH.keep).total == prefill_flops(FLASH, 100, None).total


def test_model_cli_init_info_and_generate(tmp_path, capsys):
    # init, info and generate run in this process (a python start-up fewer each); the bad model
    # directory runs as `python -m dsi.cli.main`, so its exit status and stderr are a process's.
    assert main(["model", "init", "--out", str(tmp_path / "m")]) == 0
    capsys.readouterr()
    assert main(["model", "info", "--config", "flash", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["block_bytes"] == 112_128
    assert (
        main(["generate", "--model", str(tmp_path / "m"), "--prompt", "Hello", "--max-tokens", "5", "--json"])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert len(out["token_ids"]) == 5 and out["prompt_ids"][0] == 0 and out["finish_reason"] == "length"
    bad = subprocess.run(
        [sys.executable, "-m", "dsi.cli.main", "generate", "--model", str(tmp_path), "--prompt", "x"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "not a model directory" in bad.stderr
