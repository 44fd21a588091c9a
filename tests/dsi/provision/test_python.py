"""role_python: dsi's interpreter for dsi's roles; for a vLLM role, an interpreter that has vLLM."""

import importlib.util
import sys
from pathlib import Path

import pytest

import dsi.provision.python
from dsi.config import NodeConfig, parse_config
from dsi.provision.python import NoVllm, role_python


def node(tmp_path: Path, **vllm) -> NodeConfig:
    """A prefill on dsi's engine and a decode on vLLM with the [roles.vllm] keys ``vllm``."""
    roles = [
        {"kind": "prefill", "id": "prefill-0", "bind": "tcp://127.0.0.1:7110"},
        {"kind": "decode", "id": "decode-0", "bind": "tcp://127.0.0.1:7120", "engine": "vllm", "vllm": vllm},
    ]
    return parse_config(
        {"cluster": {"controller": "tcp://127.0.0.1:7100"}, "roles": roles}, tmp_path / "n.toml"
    )


@pytest.fixture
def no_vllm_here(monkeypatch, tmp_path):
    """This interpreter without vLLM, and a .venv-vllm path under tmp_path that does not exist yet."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else find_spec(name, *a)
    )
    venv = tmp_path / ".venv-vllm"
    monkeypatch.setattr(dsi.provision.python, "VLLM_VENV", venv)
    return venv


def test_a_role_on_dsis_engine_runs_under_this_interpreter(tmp_path, no_vllm_here):
    assert role_python(node(tmp_path), "prefill-0") == sys.executable


def test_the_configured_python_is_used(tmp_path, no_vllm_here):
    python = tmp_path / "vllm-env" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.touch()
    assert role_python(node(tmp_path, python="vllm-env/bin/python"), "decode-0") == str(python)


def test_a_configured_python_that_does_not_exist_is_refused(tmp_path):
    with pytest.raises(NoVllm, match=r"\[roles.vllm\] python: .*/missing/python does not exist"):
        role_python(node(tmp_path, python="missing/python"), "decode-0")


def test_this_interpreter_when_it_has_vllm(tmp_path, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else find_spec(name, *a)
    )
    monkeypatch.setattr(dsi.provision.python, "VLLM_VENV", tmp_path / "no-venv")
    assert role_python(node(tmp_path), "decode-0") == sys.executable


def test_else_the_vllm_venv_beside_the_source(tmp_path, no_vllm_here):
    python = no_vllm_here / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.touch()
    assert role_python(node(tmp_path), "decode-0") == str(python)


def test_else_no_vllm_says_how_to_build_one(tmp_path, no_vllm_here):
    with pytest.raises(NoVllm, match="make venv-vllm") as caught:
        role_python(node(tmp_path), "decode-0")
    assert str(no_vllm_here) in str(caught.value) and "[roles.vllm] python" in str(caught.value)
