"""Speculative decoding in the engine: greedy output is the same with speculation off, fixed-5
and DSpark, with sync and async scheduling; rejected drafts roll back (SWA rings, compressor
state, block tables)."""

import pytest
import torch

from dsi.engine.engine import Engine, EngineConfig
from dsi.engine.params import SamplingParams
from dsi.engine.speculator import Speculator
from dsi.engine.step_curve import StepCurve
from dsi.model.config import ModelConfig
from dsi.model.draft import init_draft
from dsi.model.weights import init_weights

# A small shape of the same structure: 16-token pages and a 16-token window (22-slot rings), so
# that decoding crosses pages and wraps the rings many times in a few steps.
MINI = ModelConfig(
    name="mini",
    vocab_size=2048,
    hidden=64,
    n_layers=4,
    n_producer=2,
    kv_sources=(1,),
    n_heads=2,
    head_dim=32,
    window=16,
    keep=22,
    block_size=16,
    n_experts=4,
    top_k=2,
    expert_dim=64,
    shared_dim=64,
    max_context=512,
)
PROMPTS = ([5 + i for i in range(37)], [900 + 3 * i for i in range(30)], [7, 8, 9])
MAX_TOKENS = 40
CURVE = StepCurve((1, 8), (1, 2, 3, 4, 6), ((1.0, 1.1, 1.2, 1.3, 1.5),) * 2, (0.05, 0.1))


@pytest.fixture(scope="module")
def mini():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the bits do not depend on it; a shared machine runs faster so
    yield MINI, init_weights(MINI)
    torch.set_num_threads(before)


def _run(mini, mode, draft, params, oracle=None, pipelined=False):
    cfg, w = mini
    config = EngineConfig(async_scheduling=pipelined, speculative=mode, step_curve=CURVE)
    engine = Engine(cfg, w, config, draft=draft)
    if oracle is not None:
        _steer(engine.spec, oracle)
    outs = _outputs(engine, params)
    assert engine.runner.pool.num_free == engine.config.num_blocks - 1  # every page came back
    return outs, engine.spec


def _outputs(engine: Engine, params) -> dict[str, list[int]]:
    """Every prompt of PROMPTS through ``engine`` (closed after): request id -> output tokens."""
    try:
        for i, p in enumerate(PROMPTS):
            engine.add_request(str(i), p, params)
        return {o.request_id: o.output for o in engine.run_until_done() if o.finished}
    finally:
        engine.close()


def _count_fills(spec: Speculator) -> list[int]:
    """Counts the verify slices whose drafts the worker filled in (async scheduling)."""
    fills, fill = [0], spec.fill_drafts

    def counted(req, position, n, last):
        fills[0] += 1
        return fill(req, position, n, last)

    spec.fill_drafts = counted
    return fills


def _steer(spec: Speculator, oracle):
    """Replace the drafts by the true continuation with one wrong token at a position that moves
    every step, so that 0..5 drafts are accepted and every kind of rollback happens."""
    propose = spec.propose

    def steered(reqs, hidden, tokens, positions):
        propose(reqs, hidden, tokens, positions)
        for req, pos in zip(reqs, positions, strict=True):
            d = spec._drafts[id(req)]
            truth = oracle[req.request_id][pos - len(req.prompt) :][: len(d.tokens)]
            wrong = pos % 7
            d.tokens[: len(truth)] = [t + 1 if j == wrong else t for j, t in enumerate(truth)]
            d.confidence = [0.9] * len(d.tokens)

    spec.propose = steered


@pytest.fixture(scope="module")
def greedy_off(mini):
    """Greedy outputs without speculation; async scheduling gives the same."""
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    off, _ = _run(mini, "off", None, params)
    off_async, _ = _run(mini, "off", None, params, pipelined=True)
    assert off_async == off
    return off


def test_greedy_output_is_the_same_off_fixed_and_dspark(mini, greedy_off):
    draft = init_draft(mini[0].hidden, torch.arange(512))
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    off = greedy_off
    fixed, spec = _run(mini, "fixed", draft, params, oracle=off)
    assert fixed == off
    assert set(spec.stats.lengths) > {5} and spec.stats.accepted[4] > 0
    assert spec.stats.reached[0] > spec.stats.accepted[0]  # and some were rejected
    dspark, spec = _run(mini, "dspark", draft, params, oracle=off)
    assert dspark == off
    assert spec.stats.verify_slices > 0


@pytest.mark.parametrize("mode", ["fixed", "dspark"])
def test_greedy_output_with_async_scheduling_is_the_same(mini, greedy_off, mode):
    """Async scheduling: a decoding request verifies, in the step after, the drafts the step in
    flight proposes (filled in by the worker, lengths from one-step-stale confidences); the step
    after a verify slice gives it one token at the position the worker learns from the verify.
    Output equals speculation off."""
    draft = init_draft(mini[0].hidden, torch.arange(512))
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    off = greedy_off
    cfg, w = mini
    engine = Engine(
        cfg, w, EngineConfig(async_scheduling=True, speculative=mode, step_curve=CURVE), draft=draft
    )
    _steer(engine.spec, off)
    fills = _count_fills(engine.spec)
    outs = _outputs(engine, params)
    assert outs == off
    st = engine.spec.stats
    assert fills[0] > 0 and st.verify_slices >= fills[0]  # verifies of drafts filled in
    assert st.accepted[0] > 0 and st.accepted[4] > 0
    assert sum(st.reached) > sum(st.accepted)  # and some were rejected
    assert engine.runner.pool.num_free == engine.config.num_blocks - 1


@pytest.mark.parametrize("pipelined", [False, True])
def test_sampled_requests_speculate_and_stop_at_max_tokens(mini, pipelined):
    draft = init_draft(mini[0].hidden, torch.arange(512))
    params = SamplingParams(max_tokens=9, temperature=0.7, seed=3, ignore_eos=True)
    outs, spec = _run(mini, "fixed", draft, params, pipelined=pipelined)
    assert all(len(o) == 9 for o in outs.values())
    assert spec.stats.verify_slices > 0


def test_structured_output_is_the_same_with_drafts(tiny):
    """Greedy structured output: each verified position masked by the grammar advanced through
    the drafts before it; the drafts are the true continuation with one wrong token."""
    from dsi.structured import StructuredSpec

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    cfg, w = tiny
    draft = init_draft(cfg.hidden, torch.arange(512))
    spec = StructuredSpec.for_regex(r"[a-z]{3,8}-[0-9]{2}")
    params = SamplingParams(max_tokens=16, temperature=0, structured=spec)
    outs = {}
    try:
        for mode in ("off", "fixed"):
            engine = Engine(cfg, w, EngineConfig(async_scheduling=False, speculative=mode), draft=draft)
            if mode == "fixed":
                _steer(engine.spec, {"0": outs["off"][0]})
            engine.add_request("0", [100, 200, 300], params)
            done = [o for o in engine.run_until_done() if o.finished]
            outs[mode] = (done[0].output, done[0].finish_reason)
    finally:
        torch.set_num_threads(before)
    assert outs["fixed"] == outs["off"] and outs["off"][1] == "stop"
