"""A model directory is made once: generated (tiny) or imported from a GGUF source."""

import json

import pytest

import dsi.model.gguf_import
from dsi.model.prepare import ensure_model, gguf_file


def test_a_gguf_source_names_a_path_or_a_file_of_an_installed_package(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    assert gguf_file(str(path)) == path
    pytest_dir = gguf_file("pytest:__init__.py")  # any installed package will do
    assert pytest_dir.name == "__init__.py" and pytest_dir.is_file()
    with pytest.raises(ValueError, match="not installed"):
        gguf_file("no_such_package_here:x.gguf")
    with pytest.raises(ValueError, match="no file"):
        gguf_file(str(tmp_path / "absent.gguf"))


def test_ensure_model_imports_a_gguf_source_once(tmp_path, monkeypatch):
    source = tmp_path / "m.gguf"
    source.write_bytes(b"GGUF")
    calls = []

    def fake_import(path, out):
        calls.append(path)
        (out / "config.json").write_text(json.dumps({"model_type": "llama"}))

    monkeypatch.setattr(dsi.model.gguf_import, "import_gguf", fake_import)
    target = tmp_path / "run" / "models" / "m"
    assert ensure_model(target, "tiny", str(source)) == target
    assert ensure_model(target, "tiny", str(source)) == target  # found: not imported again
    assert calls == [source]
    assert json.loads((target / "config.json").read_text()) == {"model_type": "llama"}
    assert sorted(p.name for p in target.parent.iterdir()) == ["m", "m.lock"]  # no temporary left
