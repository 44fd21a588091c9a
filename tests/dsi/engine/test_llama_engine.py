"""The engine serves the Llama family: SmolLM2's greedy tokens equal transformers' on the same
dequantised weights, with all eight prompts in one continuously batched run."""

import pytest

from dsi.engine import CachedPrefix, Engine, EngineConfig, SamplingParams
from dsi.errors import InvalidRequest
from dsi.model.llama import load_llama
from tests.smollm2 import GREEDY_TOKENS, one_torch_thread


@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    return load_llama(smollm2_dir)


def _run(engine: Engine, prompts: list[list[int]]) -> list[list[int]]:
    for i, p in enumerate(prompts):
        engine.add_request(
            str(i), p, SamplingParams(max_tokens=GREEDY_TOKENS, temperature=0.0, ignore_eos=True)
        )
    outs = {o.request_id: o.output for o in engine.run_until_done() if o.finished}
    return [outs[str(i)] for i in range(len(prompts))]


@pytest.mark.parametrize("batch_invariant, count", [(True, 8), (False, 3)])
def test_greedy_tokens_equal_transformers(smollm2, smollm2_greedy, batch_invariant, count):
    """All eight prompts on the default (batch-invariant) path; three on the plain-math path."""
    prompts, expected = smollm2_greedy
    prompts, expected = prompts[:count], expected[:count]
    # 24-token chunks: every prompt is prefilled over several steps, beside other requests' decodes.
    engine = Engine(
        *smollm2,
        EngineConfig(
            num_blocks=12,
            num_slots=8,
            max_running=8,
            max_batch_tokens=24,
            batch_invariant=batch_invariant,
            async_scheduling=False,
        ),
    )
    try:
        with one_torch_thread():
            got = _run(engine, prompts)
    finally:
        engine.close()
    assert got == expected
    assert engine.load().free_pages == 11  # every page came back


def test_export_import_continues_a_llama_request(smollm2, smollm2_greedy):
    """The PD handoff path: a prefill-only request's state (pages only) continues in a second engine."""
    prompts, expected = smollm2_greedy
    config = EngineConfig(num_blocks=4, num_slots=2, max_running=2, async_scheduling=False)
    prefill, decode = Engine(*smollm2, config), Engine(*smollm2, config)
    try:
        with one_torch_thread():
            params = SamplingParams(max_tokens=GREEDY_TOKENS, temperature=0.0, ignore_eos=True)
            prefill.add_request("r", prompts[0], params, prefill_only=True)
            prefill.run_until_done()
            state = prefill.export_request("r")
            assert state.rings.numel() == 0 and state.partial.numel() == 0  # a Llama state is its pages
            decode.import_request(state)
            out = next(o for o in decode.run_until_done() if o.finished).output
    finally:
        prefill.close()
        decode.close()
    assert out == expected[0]


def test_a_prefix_hit_loads_pages_and_computes_only_the_rest(smollm2, smollm2_greedy):
    """Full-attention layers keep no SWA rings, so a hit is exact: the pages of a cold run, loaded
    into a fresh engine, give the cold run's tokens while computing only the positions past H."""
    prompts, _ = smollm2_greedy
    prompt = [t for p in prompts[:6] for t in p][:150]  # > one 128-token block
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    config = EngineConfig(
        num_blocks=4, num_slots=1, max_running=1, async_scheduling=False, collect_full_pages=True
    )
    cold, warm = Engine(*smollm2, config), Engine(*smollm2, config)
    try:
        with one_torch_thread():
            cold.add_request("a", prompt, params)
            cold_out = next(o for o in cold.run_until_done() if o.finished).output
            page = next(p for p in cold.take_full_pages() if p.index == 0)
            assert page.block_hash == cold.shape.hash_chain.hashes(prompt)[:16]
            warm.add_request("b", prompt, params, cached=CachedPrefix(128, page.data[None]))
            warm_out = next(o for o in warm.run_until_done() if o.finished).output
            stats = warm.request_stats("b")
    finally:
        cold.close()
        warm.close()
    assert warm_out == cold_out
    assert stats.cached_tokens == 128 and stats.computed_prompt_tokens == len(prompt) - 128
    assert stats.replay_tokens == 0


def test_rings_with_a_llama_hit_are_refused(smollm2):
    import torch

    engine = Engine(*smollm2, EngineConfig(num_blocks=4, num_slots=1, max_running=1, async_scheduling=False))
    try:
        pages = engine.runner.pool.pages[1:2].clone()
        with pytest.raises(InvalidRequest, match="no SWA rings"):
            engine.add_request(
                "r",
                list(range(200)),
                SamplingParams(max_tokens=1),
                cached=CachedPrefix(128, pages, torch.zeros(0, 2, 128, 3, 64)),
            )
    finally:
        engine.close()
