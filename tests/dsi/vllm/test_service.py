"""dsi.vllm.service's checks that run before vLLM is imported."""

from __future__ import annotations

import pytest

from dsi.errors import InvalidRequest
from dsi.vllm.service import check_weight_files


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
