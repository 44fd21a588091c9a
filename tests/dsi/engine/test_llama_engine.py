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
        engine.add_request(str(i), p, SamplingParams(max_tokens=GREEDY_TOKENS, temperature=0.0, ignore_eos=True))
    outs = {o.request_id: o.output for o in engine.run_until_done() if o.finished}
    return [outs[str(i)] for i in range(len(prompts))]


@pytest.mark.parametrize("batch_invariant", [True, False])
def test_greedy_tokens_equal_transformers(smollm2, smollm2_greedy, batch_invariant):
    prompts, expected = smollm2_greedy
    # 24-token chunks: every prompt is prefilled over several steps, beside other requests' decodes.
    engine = Engine(*smollm2, EngineConfig(num_blocks=12, num_slots=8, max_running=8, max_batch_tokens=24,
                                           batch_invariant=batch_invariant, async_scheduling=False))
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


def test_prefix_hits_are_refused_for_now(smollm2):
    engine = Engine(*smollm2, EngineConfig(num_blocks=4, num_slots=1, max_running=1, async_scheduling=False))
    try:
        pages = engine.runner.pool.pages[1:2].clone()
        with pytest.raises(InvalidRequest, match="llama family are planned"):
            engine.add_request("r", list(range(200)), SamplingParams(max_tokens=1), cached=CachedPrefix(128, pages))
    finally:
        engine.close()
