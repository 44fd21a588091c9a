"""dsi.vllm.service's checks that run before vLLM is imported."""

from __future__ import annotations

import pytest

from dsi.config.vllm import EngineArgs, VllmOptions
from dsi.errors import InvalidRequest
from dsi.vllm.service import apply_engine_environment, check_weight_files


def test_a_draft_beside_the_model_is_refused_with_the_file_named(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "draft.safetensors").write_bytes(b"")
    with pytest.raises(InvalidRequest, match=r"draft\.safetensors as model weights"):
        check_weight_files(tmp_path)


def test_an_index_or_a_lone_model_file_passes(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    check_weight_files(tmp_path)
    (tmp_path / "draft.safetensors").write_bytes(b"")
    (tmp_path / "model.safetensors.index.json").write_text("{}")
    check_weight_files(tmp_path)
    check_weight_files(tmp_path / "absent")  # a hub name, not a directory: vLLM resolves it


def test_the_kv_cache_gib_reaches_vllm_unless_explicit_bytes_are_given():
    plain = VllmOptions(kv_cache_gib=3, cpu_threads="nobind")
    environ = {"PATH": "/bin"}
    apply_engine_environment(environ, plain, {0, 1})
    assert environ["VLLM_CPU_KVCACHE_SPACE"] == "3" and environ["PATH"] == "/bin"
    sized = VllmOptions(kv_cache_gib=3, args=EngineArgs([("kv_cache_memory_bytes", 1 << 28)]))
    # vLLM's CPU build replaces the argument with the variable whenever the variable is set (and
    # fails on an empty one): an inherited one goes
    apply_engine_environment(environ, sized, {0, 1})
    assert "VLLM_CPU_KVCACHE_SPACE" not in environ and environ["HF_HUB_OFFLINE"] == "1"


def test_vllms_own_python_processes_never_see_the_repository_root_as_a_module_path(tmp_path):
    """vLLM inspects a model in ``python -m vllm...``; from the repository root that found dsi's
    ``kernels/`` folder as the bare ``kernels`` transformers looks for, and the engine failed."""
    import os
    import subprocess
    import sys

    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("raise ImportError('shadowed')\n")
    environ = dict(os.environ)
    apply_engine_environment(environ, VllmOptions(cpu_threads="nobind"), {0, 1})
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('kernels') is not None and 'shadowed' in open(importlib.util.find_spec('kernels').origin).read())"
    ran = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=environ, timeout=60)
    assert ran.returncode == 0
    environ.pop("PYTHONSAFEPATH")
    shadowed = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=environ, timeout=60)
    assert shadowed.returncode == 1  # the probe can fail: without the setting the folder is found


def test_one_unbound_worker_runs_in_the_engine_core_and_bound_or_parallel_engines_keep_vllms_executor():
    environ: dict[str, str] = {}
    apply_engine_environment(environ, VllmOptions(cpu_threads="nobind"), {0, 1})
    assert environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    for bound in ("@0", "0-1", "auto"):  # vLLM binds the threads of its workers only
        environ = {}
        apply_engine_environment(environ, VllmOptions(cpu_threads=bound), {0, 1})
        assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in environ, bound
    for args in (
        [("tensor_parallel_size", 2)],
        [("pipeline_parallel_size", 2)],
        [("data_parallel_size", 2)],
        [("distributed_executor_backend", "mp")],
    ):
        environ = {}
        apply_engine_environment(environ, VllmOptions(cpu_threads="nobind", args=EngineArgs(args)), {0, 1})
        assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in environ, args
