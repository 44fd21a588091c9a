"""Plots: drawn where matplotlib is importable, nothing (and no error) where it is not."""

from __future__ import annotations

import pytest

from dsi.sim import plots

RESULT = {
    "experiment": "cache",
    "letter": "e",
    "title": "t",
    "variants": [{"name": "global", "summary": {"hit_rate": 0.4, "ttft_s": {"p99": 0.3}}}],
}


def test_without_matplotlib_nothing_is_drawn(tmp_path, monkeypatch):
    monkeypatch.setattr(plots, "available", lambda: False)
    assert plots.plot(RESULT, tmp_path) == []


@pytest.mark.skipif(not plots.available(), reason="matplotlib is not installed (not a dsi dependency)")
def test_with_matplotlib_a_png_is_written(tmp_path):
    (path,) = plots.plot(RESULT, tmp_path)
    assert path.name == "e_cache.png" and path.read_bytes()[:4] == b"\x89PNG"
