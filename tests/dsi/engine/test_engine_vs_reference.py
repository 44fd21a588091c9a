"""The paged, batched, chunked, preempting engine against the naive reference."""

import random

import pytest
import torch

from dsi.engine.batch import StepSlice
from dsi.engine.engine import Engine, EngineConfig
from dsi.engine.params import SamplingParams
from dsi.engine.runner import ModelRunner
from dsi.model.reference import consumer_start, reference_logits
from tests.dsi.engine.conftest import random_prompts

_rng = random.Random(7)
# 32 prompts from 1 to 2,000 tokens: around the window (128), keep (140) and page (128) edges.
LENGTHS = [
    1,
    2,
    3,
    7,
    127,
    128,
    129,
    133,
    134,
    139,
    140,
    141,
    200,
    255,
    256,
    257,
    383,
    500,
    777,
    1024,
    1500,
    2000,
    *sorted(_rng.randrange(1, 2001) for _ in range(10)),
]
NEW = 5


def test_reference_fixture_checked_32_prompts(reference):
    assert len(reference) == 32 and all(len(out) == NEW for out in reference)


def _reference_greedy(cfg, w, prompt, output, keep):
    """Teacher-forced reference: argmax at each generated position, one forward pass."""
    logits = reference_logits(cfg, w, prompt + output[:-1], len(prompt), keep, from_pos=len(prompt) - 1)
    return logits[len(prompt) - 1 :].argmax(-1).tolist()


def _engine_greedy(cfg, w, prompts, config):
    engine = Engine(cfg, w, config)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, SamplingParams(max_tokens=NEW, temperature=0))
    done = {o.request_id: o.output for o in engine.run_until_done() if o.finished}
    pool, slots = engine.runner.pool, engine.runner.slots
    assert pool.num_free == pool.num_blocks - 1 and slots.num_free == slots.num_slots  # nothing leaks
    engine.close()
    return [done[str(i)] for i in range(len(prompts))], engine.scheduler.preemptions


@pytest.fixture(scope="module")
def prompts():
    assert len(LENGTHS) == 32
    return random_prompts(LENGTHS, seed=1)


@pytest.fixture(scope="module")
def reference(tiny, prompts):
    cfg, w = tiny
    outs, _ = _engine_greedy(cfg, w, prompts, EngineConfig(async_scheduling=True))
    for prompt, out in zip(prompts, outs, strict=True):
        assert _reference_greedy(cfg, w, prompt, out, cfg.keep) == out
    return outs


@pytest.mark.parametrize(
    "config",
    [
        EngineConfig(async_scheduling=True, max_batch_tokens=193),
        EngineConfig(async_scheduling=False, max_batch_tokens=640),
    ],
    ids=["async-chunk193", "sync-chunk640"],
)
def test_batched_greedy_is_token_identical_to_reference(tiny, prompts, reference, config):
    cfg, w = tiny
    outs, _ = _engine_greedy(cfg, w, prompts, config)
    assert outs == reference


def test_forced_preemption_keeps_outputs(tiny, prompts, reference):
    cfg, w = tiny
    outs, preemptions = _engine_greedy(cfg, w, prompts, EngineConfig(num_blocks=24, max_batch_tokens=512))
    assert preemptions > 0
    assert outs == reference


def test_replay_off_matches_full_reference(tiny):
    cfg, w = tiny
    prompts = random_prompts([150, 400, 900], seed=3)
    outs, _ = _engine_greedy(cfg, w, prompts, EngineConfig(replay=False))
    for prompt, out in zip(prompts, outs, strict=True):
        assert _reference_greedy(cfg, w, prompt, out, None) == out


@pytest.mark.parametrize(("length", "chunk"), [(5, 5), (141, 50), (700, 128), (1300, 1300)])
def test_logits_within_1e4_of_reference(tiny, length, chunk):
    cfg, w = tiny
    runner = ModelRunner(cfg, w, num_blocks=32, num_slots=2)
    prompt = random_prompts([length], seed=length)[0]
    slot, table = runner.slots.allocate(), runner.pool.allocate(-(-(length + 4) // 128))
    start = consumer_start(length, cfg.keep)
    tokens = list(prompt)
    for a in range(0, length, chunk):
        b = min(length, a + chunk)
        logits = runner.forward([StepSlice(slot, table, a, prompt[a:b], start, b == length)])
    for _ in range(4):
        ref = reference_logits(cfg, w, tokens, length, cfg.keep, last_only=True)[0]
        assert torch.allclose(logits[0], ref, atol=1e-4, rtol=0)
        tokens.append(int(logits[0].argmax()))
        logits = runner.forward([StepSlice(slot, table, len(tokens) - 1, tokens[-1:], start, True)])
