"""dsi bench vllm-cluster's dsi serve configs, derived from configs/vllm.toml."""

from pathlib import Path

import pytest

from dsi.bench.vllm_cluster_config import (
    DECODES,
    PD,
    SINGLE,
    source_config,
    vllm_roles,
    with_layout,
    write_config,
)
from dsi.config import load_config


def _engines(cfg) -> list[tuple[str, str, str]]:
    """(kind, id, cpu_threads) of each vLLM role, in config order."""
    roles = vllm_roles(cfg)
    return [(r.kind, r.id, roles[r.id].cpu_threads) for r in cfg.roles if r.id in roles]


@pytest.mark.parametrize("layout", [DECODES, PD, SINGLE])
def test_the_private_config_has_the_layouts_vllm_instances_on_free_ports(tmp_path, layout):
    path = write_config(layout, Path("/models/smollm2"), tmp_path / "side")
    cfg = load_config(path)
    assert _engines(cfg) == [(kind, role_id, cores) for kind, role_id, cores in layout]
    kinds = [r.kind for r in cfg.roles]
    assert kinds.count("controller") == kinds.count("kvstore") == kinds.count("balancer") == 1
    source = load_config(source_config())
    assert {r.bind for r in cfg.roles}.isdisjoint({r.bind for r in source.roles})
    assert all(r.bind.startswith("tcp://127.0.0.1:") for r in cfg.roles)
    assert cfg.model.dir == Path("/models/smollm2")
    kvstore = next(r for r in cfg.roles if r.kind == "kvstore")
    assert Path(kvstore.options.store_dir).is_relative_to(tmp_path / "side")


def test_each_instance_keeps_the_source_roles_vllm_options():
    source = vllm_roles(load_config(source_config()))
    text = with_layout(source_config().read_text(), DECODES)
    assert 'kind = "prefill"' not in text
    assert text.count('kind = "decode"') == 2
    assert text.count("args = { enforce_eager = true, max_num_seqs = 32 }") == 2
    assert text.count("max_model_len = 4096") == 2
    assert source["decode-0"].dtype == "float32"


def test_the_pd_layout_is_the_source_configs_own():
    assert _engines(load_config(source_config())) == list(PD)


def test_a_kind_the_source_lacks_is_an_error():
    text = with_layout(source_config().read_text(), SINGLE)  # no prefill left to copy
    with pytest.raises(ValueError, match="no prefill role"):
        with_layout(text, PD)


def test_a_kv_cache_size_reaches_every_instance_and_its_vllm(tmp_path):
    from dsi.vllm.service import engine_environment

    cfg = load_config(
        write_config(DECODES, Path("/models/smollm2"), tmp_path / "side", kv_cache_bytes=3 << 27)
    )
    for options in vllm_roles(cfg).values():
        assert options.args.get("kv_cache_memory_bytes") == 3 << 27
        assert options.args.get("max_num_seqs") == 32  # the source's arguments stay
        assert "VLLM_CPU_KVCACHE_SPACE" not in engine_environment(options, {0, 1})
