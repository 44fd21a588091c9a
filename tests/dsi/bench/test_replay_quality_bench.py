"""dsi bench replay-quality on the tiny seeded Gemma 3 shape: prompt windows, and the figures
follow the rows (exact hits agree with the hit-free run bit for bit)."""

import random

import pytest

from dsi.bench.replay_quality import corpus_text, make_prompts, measure
from tests.gemma3 import TINY_GEMMA3, tiny_weights
from tests.smollm2 import one_torch_thread


def test_prompt_windows_end_before_the_tokens_cross_a_boundary():
    ids = list(range(5000))
    prompts = make_prompts(ids, 20, 1024, 4096, 32, 128)
    assert len(prompts) == 20 and all(p[0] == 0 for p in prompts)
    assert all(1024 <= len(p) <= 4096 and 1 <= len(p) % 128 <= 96 for p in prompts)
    assert prompts[0][1] == 1 and prompts[-1][-1] == 4999  # first and last windows touch the ends
    with pytest.raises(ValueError, match="longer than max_len"):
        make_prompts(ids[:4000], 2, 1024, 4096, 32, 128)
    assert "if_stmt" in corpus_text()  # Python's language reference, from the stdlib


def test_figures_follow_the_rows():
    rng = random.Random(4)
    ids = [2] + [rng.randrange(3, 512) for _ in range(2000)]
    prompts = make_prompts(ids, 3, 300, 600, 4, 128)
    with one_torch_thread():
        out = measure(TINY_GEMMA3, tiny_weights(), prompts, 4, group=2)
    rows = out["rows"]
    assert out["prompts"] == 3 and len(rows) == 3
    assert out["exact_vs_free_identical"] == 1.0 and out["exact_mean_abs_logprob_diff"] == 0.0
    for r in rows:
        assert r["hit"] == (r["prompt_tokens"] - 1) // 128 * 128
        assert r["replay_start"] == max(0, r["hit"] - 160)
        assert r["exact_agree"] == 4 and 0 <= r["bounded_agree"] <= 4
    assert out["bounded_vs_free_identical"] == round(sum(r["bounded_agree"] == 4 for r in rows) / 3, 4)
    assert out["bounded_vs_free_mean_agreeing_prefix"] == round(sum(r["bounded_agree"] for r in rows) / 3, 2)


def test_forced_scoring_follows_the_engine_up_to_where_the_outputs_part():
    """The teacher-forced log-probs of the hit-free continuation under a bounded hit equal the
    bounded run's own log-probs for as long as the two outputs agree, and its greedy tokens are
    the bounded run's output up to and including the first token that differs."""
    import torch

    from dsi.bench.replay_quality import forced
    from dsi.engine import CachedPrefix, Engine, EngineConfig, SamplingParams
    from dsi.engine.runner_gemma3 import Gemma3Runner

    cfg, w = TINY_GEMMA3, tiny_weights()
    rng = random.Random(6)
    prompt = [rng.randrange(512) for _ in range(420)]
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=True)
    config = EngineConfig(num_blocks=8, num_slots=1, max_running=1, async_scheduling=False)
    with one_torch_thread():
        cold = Engine(cfg, w, EngineConfig(num_blocks=8, num_slots=1, collect_full_pages=True))
        cold.add_request("c", prompt, params)
        free = next(o for o in cold.run_until_done() if o.finished).output
        pages = torch.stack([p.data for p in sorted(cold.take_full_pages(), key=lambda p: p.index)][:3])
        cold.close()
        warm = Engine(cfg, w, config)
        warm.add_request("b", prompt, params, cached=CachedPrefix(384, pages))
        done = next(o for o in warm.run_until_done() if o.finished)
        warm.close()
        forced_lp, greedy = forced(cfg, Gemma3Runner(cfg, w, 8, 1), prompt, free, CachedPrefix(384, pages))
    agree = next((k for k, (a, b) in enumerate(zip(free, done.output, strict=True)) if a != b), 6)
    assert forced_lp[:agree] == done.logprobs[:agree]
    assert greedy[: agree + 1] == done.output[: agree + 1]
    assert agree == 6 or forced_lp[agree] < done.logprobs[agree]  # the run's own choice was likelier
