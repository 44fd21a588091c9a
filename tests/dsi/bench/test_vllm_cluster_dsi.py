"""dsi bench vllm-cluster's dsi side, as far as it goes without starting dsi serve."""

from pathlib import Path

from dsi.bench.vllm_cluster_config import DECODES, SINGLE
from dsi.bench.vllm_cluster_dsi import DsiSide, log_tail


def test_the_side_knows_its_gateway_and_vllm_roles_before_it_starts(tmp_path):
    side = DsiSide(DECODES, Path("/models/smollm2"), tmp_path / "dsi")
    assert list(side.roles) == ["decode-0", "decode-1"]
    assert side.url.startswith("http://127.0.0.1:") and side.warm_urls == [side.url] * 2
    assert set(side.binds) == {"decode-0", "decode-1"}
    assert side.config.parent == tmp_path / "dsi"
    side.stop()  # never started: nothing to stop, nothing left behind


def test_a_new_side_starts_from_an_empty_directory(tmp_path):
    (tmp_path / "dsi").mkdir()
    (tmp_path / "dsi" / "stale.log").write_text("old")
    DsiSide(SINGLE, Path("/models/smollm2"), tmp_path / "dsi")
    assert not (tmp_path / "dsi" / "stale.log").exists()


def test_log_tail(tmp_path):
    log = tmp_path / "serve.log"
    log.write_text("a\nb\nc\n")
    assert log_tail(log, 2) == "b | c"
    assert log_tail(tmp_path / "missing.log") == ""
