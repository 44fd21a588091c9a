"""Speculative decoding on the Llama family (SmolLM2): greedy output with fixed-5 and DSpark
equals speculation off (transformers' tokens), verify slices going through the batched paged
attention and rejected drafts rolled back in the block tables."""

import pytest
import torch

from dsi.engine import Engine, EngineConfig, SamplingParams
from dsi.engine.step_curve import StepCurve
from dsi.model.draft import init_draft
from dsi.model.llama import load_llama
from tests.dsi.engine.test_speculative import _steer
from tests.smollm2 import GREEDY_TOKENS, one_torch_thread

CURVE = StepCurve((1, 8), (1, 2, 3, 4, 6), ((1.0, 1.1, 1.2, 1.3, 1.5),) * 2, (0.05, 0.1))


@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    return load_llama(smollm2_dir)


def test_greedy_tokens_with_drafts_equal_transformers(smollm2, smollm2_greedy):
    """Drafts are the true continuation with one wrong token at a position that moves every
    step, so that 0..5 drafts are accepted and rejected positions roll back. One engine (its
    weights packed once) runs fixed-5, then DSpark."""
    prompts, expected = smollm2_greedy
    prompts, expected = prompts[:2], expected[:2]
    cfg, w = smollm2
    config = EngineConfig(
        num_blocks=4,
        num_slots=2,
        max_running=2,
        async_scheduling=False,
        speculative="dspark",
        step_curve=CURVE,
    )
    engine = Engine(cfg, w, config, draft=init_draft(cfg.hidden, torch.arange(512), layers=1, ffn=64))
    params = SamplingParams(max_tokens=GREEDY_TOKENS, temperature=0.0, ignore_eos=True)
    _steer(engine.spec, {f"{m}{i}": e for m in ("fixed", "dspark") for i, e in enumerate(expected)})
    try:
        for mode in ("fixed", "dspark"):
            engine.spec.mode = mode
            with one_torch_thread():
                for i, p in enumerate(prompts):
                    engine.add_request(f"{mode}{i}", p, params)
                outs = {o.request_id: o.output for o in engine.run_until_done() if o.finished}
            assert [outs[f"{mode}{i}"] for i in range(len(prompts))] == expected, mode
            st = engine.spec.stats
            assert st.verify_slices > 0 and st.reached[0] > st.accepted[0] > 0  # some accepted, some not
            assert engine.load().free_pages == 3  # every page came back
    finally:
        engine.close()
    assert set(st.lengths) > {5}  # fixed verified 5; dspark chose other lengths too
