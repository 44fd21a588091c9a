"""Frequency and presence penalties: the engine's greedy output equals the naive reference's in
every scheduling mode, after preemptions and across an export/import (disaggregation)."""

import pytest
import torch

from dsi.engine import Engine, EngineConfig
from dsi.engine.params import SamplingParams
from dsi.errors import InvalidRequest
from dsi.model.reference import reference_generate
from tests.dsi.engine.conftest import random_prompts

NEW = 10
LENGTHS = [5, 60, 130, 300, 124, 122, 125, 123]
# (prompt, frequency, presence). The tiny model's weights are random and its greedy output
# seldom repeats a token, and a positive penalty changes only an output that repeats: prompt 6
# repeats itself without penalties; the other cases have a negative part that makes them
# repeat, and a positive part that then matters.
CASES = [
    (6, 2.0, 0.0),
    (6, 0.0, 1.0),
    (0, 1.5, -2.0),
    (1, 0.8, -1.5),
    (2, 0.0, -2.0),
    (0, -1.0, 0.0),
    (3, 0.0, -1.5),
]
# Four prompts that need a second page while decoding: with 5 usable pages one is preempted.
PREEMPTED = [(4, 0.0, -2.0), (5, 0.8, -1.5), (6, 1.5, -2.0), (7, 0.0, -2.0)]


def _params(frequency, presence, **kw):
    return SamplingParams(
        max_tokens=NEW,
        temperature=0,
        frequency_penalty=frequency,
        presence_penalty=presence,
        logprobs=True,
        **kw,
    )


def _run(cfg, w, prompts, config, cases=CASES):
    engine = Engine(cfg, w, config)
    for i, (k, f, p) in enumerate(cases):
        engine.add_request(str(i), prompts[k], _params(f, p))
    done = {o.request_id: o for o in engine.run_until_done() if o.finished}
    preemptions = engine.scheduler.preemptions
    engine.close()
    return [done[str(i)] for i in range(len(cases))], preemptions


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(LENGTHS, seed=17)


@pytest.fixture(scope="module")
def reference(tiny, prompts):
    cfg, w = tiny
    out = []
    for k, f, p in CASES:
        tokens, rows = reference_generate(
            cfg, w, prompts[k], NEW, cfg.keep, frequency_penalty=f, presence_penalty=p
        )
        logprobs = [float(torch.log_softmax(row, -1)[t]) for row, t in zip(rows, tokens, strict=True)]
        out.append((tokens, logprobs))
    return out


def test_every_part_of_each_penalty_changes_the_output(tiny, prompts, reference):
    cfg, w = tiny
    plain = [(k, 0.0, 0.0) for k, _, _ in CASES]
    negative_only = [(k, min(f, 0.0), min(p, 0.0)) for k, f, p in CASES]
    outs, _ = _run(cfg, w, prompts, EngineConfig(), plain + negative_only)
    for i, (tokens, _) in enumerate(reference):
        assert tokens != outs[i].output
        if min(CASES[i][1:]) < 0 < max(CASES[i][1:]):  # the positive part matters too
            assert tokens != outs[len(CASES) + i].output


@pytest.mark.parametrize(
    "config",
    [
        EngineConfig(async_scheduling=True),
        EngineConfig(async_scheduling=False),
        EngineConfig(async_scheduling=True, max_batch_tokens=64),
    ],
    ids=["async", "sync", "async-chunk64"],
)
def test_greedy_with_penalties_equals_the_reference(tiny, prompts, reference, config):
    cfg, w = tiny
    outs, _ = _run(cfg, w, prompts, config)
    for out, (tokens, logprobs) in zip(outs, reference, strict=True):
        assert out.output == tokens
        assert torch.allclose(torch.tensor(out.logprobs), torch.tensor(logprobs), atol=1e-4, rtol=0)


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_preempted_requests_keep_their_counts(tiny, prompts, async_scheduling):
    cfg, w = tiny
    plain = [(k, 0.0, 0.0) for k, _, _ in PREEMPTED]
    roomy, _ = _run(cfg, w, prompts, EngineConfig(async_scheduling=False), PREEMPTED + plain)
    assert all(a.output != b.output for a, b in zip(roomy[:4], roomy[4:], strict=True))
    roomy = roomy[:4]
    tight, preemptions = _run(
        cfg, w, prompts, EngineConfig(num_blocks=6, async_scheduling=async_scheduling), PREEMPTED
    )
    assert preemptions > 0
    assert [o.output for o in tight] == [o.output for o in roomy]


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_counts_continue_across_export_and_import(tiny, prompts, reference, async_scheduling):
    """The decode continues what the prefill started; mid-decode migration too."""
    cfg, w = tiny
    k, f, p = CASES[3]
    prompt = prompts[k]
    prefill = Engine(cfg, w, EngineConfig(async_scheduling=async_scheduling))
    prefill.add_request("r", prompt, _params(f, p), prefill_only=True)
    prefill.run_until_done()
    state = prefill.export_request("r")
    middle = Engine(cfg, w, EngineConfig(async_scheduling=async_scheduling))
    middle.import_request(state)
    for _ in range(5):
        middle.step()
    moved = middle.export_request("r")
    assert 1 < len(moved.output) < NEW
    decode = Engine(cfg, w, EngineConfig(async_scheduling=async_scheduling))
    decode.import_request(moved)
    done = {o.request_id: o for o in decode.run_until_done() if o.finished}
    for engine in (prefill, middle, decode):
        engine.close()
    assert done["r"].output == reference[3][0]


def test_sampled_output_with_penalties_is_reproducible_per_seed(tiny, prompts):
    cfg, w = tiny
    params = SamplingParams(
        max_tokens=NEW, temperature=0.8, seed=5, frequency_penalty=1.0, presence_penalty=0.5
    )
    outs = []
    for config in (
        EngineConfig(async_scheduling=True),
        EngineConfig(async_scheduling=False, max_batch_tokens=64),
    ):
        engine = Engine(cfg, w, config)
        engine.add_request("other", prompts[3], SamplingParams(max_tokens=NEW, temperature=1.0))
        engine.add_request("r", prompts[1], params)
        outs.append({o.request_id: o.output for o in engine.run_until_done() if o.finished}["r"])
        engine.close()
    assert outs[0] == outs[1]


@pytest.mark.parametrize("field", ["frequency_penalty", "presence_penalty"])
@pytest.mark.parametrize("value", [2.01, -2.5, float("nan")])
def test_penalties_out_of_range_are_refused(tiny, field, value):
    cfg, w = tiny
    engine = Engine(cfg, w, EngineConfig(num_blocks=8, num_slots=2))
    with pytest.raises(InvalidRequest, match=field):
        engine.add_request("r", [5, 6], SamplingParams(**{field: value}))
    engine.close()
