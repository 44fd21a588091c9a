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


@pytest.mark.parametrize("mode", ["fixed", "dspark"])
def test_greedy_tokens_with_drafts_equal_transformers(smollm2, smollm2_greedy, mode):
    """Drafts are the true continuation with one wrong token at a position that moves every
    step, so that 0..5 drafts are accepted and rejected positions roll back."""
    prompts, expected = smollm2_greedy
    prompts, expected = prompts[:2], expected[:2]
    cfg, w = smollm2
    engine = Engine(
        cfg,
        w,
        EngineConfig(
            num_blocks=8,
            num_slots=4,
            max_running=4,
            async_scheduling=False,
            speculative=mode,
            step_curve=CURVE,
        ),
        draft=init_draft(cfg.hidden, torch.arange(512), layers=1, ffn=64),
    )
    _steer(engine.spec, {str(i): e for i, e in enumerate(expected)})
    params = SamplingParams(max_tokens=GREEDY_TOKENS, temperature=0.0, ignore_eos=True)
    try:
        with one_torch_thread():
            for i, p in enumerate(prompts):
                engine.add_request(str(i), p, params)
            outs = {o.request_id: o.output for o in engine.run_until_done() if o.finished}
    finally:
        engine.close()
    assert [outs[str(i)] for i in range(len(prompts))] == expected
    st = engine.spec.stats
    assert st.verify_slices > 0 and st.reached[0] > st.accepted[0] > 0  # some accepted, some not
    assert engine.load().free_pages == 3  # every page came back
