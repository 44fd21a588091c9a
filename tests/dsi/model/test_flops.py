"""The closed-form FLOP count against a position-by-position count of the same definition."""

import subprocess
import sys

import pytest

from dsi.model.config import FLASH, TINY, ModelConfig
from dsi.model.flops import decode_flops, prefill_flops
from dsi.model.hits import consumer_start, replay_start


def _attention_by_position(cfg: ModelConfig, positions, swa_start: int, pooled: int) -> float:
    total = 0.0
    for t in positions:
        keys = min(cfg.window, t + 1 - swa_start)
        index = 0.0
        if pooled:
            vis = (t + 1) // pooled
            keys += min(vis, cfg.index_topk) if cfg.index_topk else vis
            index = 2.0 * cfg.index_dim * vis
        total += 4.0 * cfg.n_heads * cfg.head_dim * keys + index
    return total


def _prefill_by_position(cfg: ModelConfig, n: int, keep: int | None, hit: int) -> float:
    h, d = cfg.hidden, cfg.head_dim
    dense = 2.0 * (
        h * (2 * cfg.n_heads + 2 * cfg.n_kv_heads) * d
        + h * cfg.n_experts
        + 3 * h * (cfg.top_k * cfg.expert_dim + cfg.shared_dim)
    )
    start = consumer_start(n, keep)
    first = replay_start(hit, start, cfg.window)
    total = 2.0 * h * cfg.vocab_size + 2.0 * (n - first) * h * d
    for layer in range(cfg.n_layers):
        if layer < cfg.n_producer:
            pooled = cfg.compress_ratio if cfg.source_of(layer) is not None else 0
            total += (n - first) * dense + _attention_by_position(cfg, range(first, n), first, pooled)
            total += 2.0 * (n - first) * h * d if layer in cfg.kv_sources else 0.0
        else:
            total += (n - start) * dense + _attention_by_position(cfg, range(start, n), start, 1)
    return total


@pytest.mark.parametrize("cfg", [TINY, FLASH], ids=["tiny", "flash"])
@pytest.mark.parametrize(
    ("n", "hit"), [(1, 0), (2, 0), (129, 0), (141, 0), (300, 128), (1100, 1024), (1100, 256), (2500, 0)]
)
def test_closed_form_equals_the_count_by_position(cfg, n, hit):
    for keep in (None, cfg.keep):
        expect = _prefill_by_position(cfg, n, keep, hit)
        assert prefill_flops(cfg, n, keep, hit=hit).total == pytest.approx(expect, rel=1e-12)


def test_a_hit_saves_the_cached_positions_but_replays_the_window_before_it():
    full = prefill_flops(FLASH, 40_000, FLASH.keep).total
    hit = prefill_flops(FLASH, 40_000, FLASH.keep, hit=32_768).total
    uncached = prefill_flops(FLASH, 40_000 - 32_768, FLASH.keep).total
    assert hit < full / 4
    assert hit > uncached  # the 7,232 computed tokens see 32K more keys, and 128 are replayed
    with pytest.raises(ValueError, match="hit"):
        prefill_flops(FLASH, 100, FLASH.keep, hit=100)


def test_flash_prefill_is_nearly_linear_in_length():
    # the indexer's top-k (512) caps what a query attends; only the 32-wide index scoring grows
    per_token = [prefill_flops(FLASH, n, FLASH.keep).total / n for n in (16_384, 262_144, 1_048_576)]
    assert max(per_token) < 1.02 * min(per_token)
    assert per_token[1] < per_token[2]  # the quadratic term exists: it wins past ~256K


def test_decode_flops_grow_with_context_only_through_the_indexer():
    short, long = decode_flops(FLASH, 1_000), decode_flops(FLASH, 1_001_000)
    assert 0 < long - short < 0.07 * short  # 1M more keys cost 6% more than a short context
    assert decode_flops(TINY, 0) > 0


def test_importing_the_flop_count_needs_no_torch():
    code = "import sys, dsi.model.flops; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_llama_flops_count_every_layer_from_the_hit_on():
    from dsi.model.llama import LlamaConfig

    cfg = LlamaConfig(
        "l", vocab_size=100, hidden=64, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=16, intermediate=96
    )
    full, hit = prefill_flops(cfg, 300, None), prefill_flops(cfg, 300, None, hit=128)
    assert full.producer - hit.producer == pytest.approx(prefill_flops(cfg, 128, None).producer)
    assert full.boundary == full.consumer == 0.0 and full.logits == 2.0 * 64 * 100
    assert decode_flops(cfg, 299) == pytest.approx(prefill_flops(cfg, 300, None, hit=299).total)
