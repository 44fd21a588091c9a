"""Prefix hits: cached pages in, encoder-side bounded SWA replay, output of the reference with the hit."""

import pytest
import torch

from dsi.engine import CachedPrefix, Engine, EngineConfig
from dsi.engine.params import SamplingParams
from dsi.errors import InvalidRequest
from dsi.model.reference import consumer_start, reference_generate, reference_logits, replay_start
from tests.dsi.engine.conftest import random_prompts

NEW = 5
GREEDY = SamplingParams(max_tokens=NEW, temperature=0)
# (prompt length, hit): R = 0; R = H - 128; R = consumer_start < H - 128 (odd); a long uncached tail.
CASES = [(200, 128), (129, 128), (300, 256), (261, 256), (700, 640), (1000, 384)]


def cold_prefix(cfg, w, prompt, hit):
    """The first ``hit`` tokens' pages as an earlier hit-free run persisted them (its FullPages)."""
    engine = Engine(cfg, w, EngineConfig(collect_full_pages=True, max_batch_tokens=300))
    engine.add_request("cold", prompt, SamplingParams(max_tokens=1, temperature=0))
    engine.run_until_done()
    pages = {p.index: p.data for p in engine.take_full_pages()}
    engine.close()
    return CachedPrefix(hit, torch.stack([pages[i] for i in range(hit // cfg.block_size)]))


def reference_with_hit(cfg, w, prompt, output, hit):
    """Teacher-forced reference_logits(hit=...): the argmax at each generated position."""
    logits = reference_logits(
        cfg, w, prompt + output[:-1], len(prompt), cfg.keep, from_pos=len(prompt) - 1, hit=hit
    )
    return logits[len(prompt) - 1 :].argmax(-1).tolist()


@pytest.fixture(scope="module")
def cases(tiny):
    cfg, w = tiny
    prompts = random_prompts([n for n, _ in CASES], seed=51)
    return [(p, h, cold_prefix(cfg, w, p, h)) for p, (_, h) in zip(prompts, CASES, strict=True)]


def _run(cfg, w, cases, config, extra=()):
    engine = Engine(cfg, w, config)
    for i, (prompt, _, cached) in enumerate(cases):
        engine.add_request(str(i), prompt, GREEDY, cached=cached)
    for i, prompt in enumerate(extra):
        engine.add_request(f"x{i}", prompt, GREEDY)
    done = {o.request_id: o.output for o in engine.run_until_done() if o.finished}
    pool, slots = engine.runner.pool, engine.runner.slots
    assert pool.num_free == pool.num_blocks - 1 and slots.num_free == slots.num_slots
    engine.close()
    return [done[str(i)] for i in range(len(cases))], engine


@pytest.fixture(scope="module")
def hit_outputs(tiny, cases):
    cfg, w = tiny
    outs, engine = _run(cfg, w, cases, EngineConfig())
    for (prompt, hit, _), out in zip(cases, outs, strict=True):
        assert reference_with_hit(cfg, w, prompt, out, hit) == out
    return outs, engine


def test_hit_output_is_the_reference_with_the_hit(hit_outputs):
    outs, _ = hit_outputs
    assert len(outs) == len(CASES) and all(len(o) == NEW for o in outs)


def test_reference_generate_with_hit_agrees(tiny, cases, hit_outputs):
    cfg, w = tiny
    prompt, hit, _ = cases[2]
    assert reference_generate(cfg, w, prompt, NEW, cfg.keep, hit=hit)[0] == hit_outputs[0][2]


@pytest.mark.parametrize(
    "config",
    [
        EngineConfig(async_scheduling=True, max_batch_tokens=97),
        EngineConfig(async_scheduling=False, max_batch_tokens=97),
        EngineConfig(async_scheduling=False, max_batch_tokens=640),
    ],
    ids=["async-chunk97", "sync-chunk97", "sync-chunk640"],
)
def test_chunked_and_batched_hits_match(tiny, cases, hit_outputs, config):
    cfg, w = tiny
    outs, _ = _run(cfg, w, cases, config, extra=random_prompts([150, 3, 400], seed=52))
    assert outs == hit_outputs[0]


def test_only_the_replay_window_and_the_uncached_tokens_are_computed(tiny, cases, hit_outputs):
    cfg, _ = tiny
    _, engine = hit_outputs
    total_replay = total_computed = 0
    for i, (prompt, hit, _) in enumerate(cases):
        r = replay_start(hit, consumer_start(len(prompt), cfg.keep), cfg.window)
        st = engine.stats.last_request(str(i))
        assert (st.cached_tokens, st.replay_tokens, st.computed_prompt_tokens) == (
            hit,
            hit - r,
            len(prompt) - r,
        )
        total_replay += hit - r
        total_computed += len(prompt) - r
    assert (
        engine.stats.replay_tokens == total_replay and engine.stats.computed_prompt_tokens == total_computed
    )
    assert engine.stats.cached_tokens == sum(h for _, h in CASES)
    assert engine.stats.prompt_tokens == sum(n for n, _ in CASES)
    # Replay starts: 0, 0, 128, consumer_start 121 (odd), 512, 256.
    assert [replay_start(h, consumer_start(n, cfg.keep), cfg.window) for n, h in CASES] == [
        0,
        0,
        128,
        121,
        512,
        256,
    ]


def test_preempted_hit_requests_keep_the_hit_semantics(tiny, cases, hit_outputs):
    cfg, w = tiny
    outs, engine = _run(cfg, w, cases, EngineConfig(num_blocks=12, max_batch_tokens=256))
    assert engine.scheduler.preemptions > 0
    assert outs == hit_outputs[0]


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda e, p: CachedPrefix(100, torch.zeros(1, e.shape.page_elems)), "whole 128-token blocks"),
        (lambda e, p: CachedPrefix(384, torch.zeros(3, e.shape.page_elems)), "leaves no prompt token"),
        (lambda e, p: CachedPrefix(256, torch.zeros(1, e.shape.page_elems)), "float32"),
        (lambda e, p: CachedPrefix(128, torch.zeros(1, e.shape.page_elems + 1)), "float32"),
        (lambda e, p: CachedPrefix(128, torch.zeros(1, e.shape.page_elems, dtype=torch.float64)), "float32"),
        (lambda e, p: CachedPrefix(128, [[0.0]]), "float32"),
        (lambda e, p: CachedPrefix(-128, torch.zeros(0, e.shape.page_elems)), "whole 128-token blocks"),
    ],
)
def test_bad_cached_prefix_is_rejected_and_engine_keeps_serving(tiny, make, match):
    cfg, w = tiny
    prompt = random_prompts([384], seed=53)[0]
    engine = Engine(cfg, w)
    engine.add_request("good", [7, 8, 9], SamplingParams(max_tokens=3, temperature=0))
    with pytest.raises(InvalidRequest, match=match):
        engine.add_request("bad", prompt, GREEDY, cached=make(engine, prompt))
    outs = {o.request_id: o for o in engine.run_until_done() if o.finished}
    engine.close()
    assert list(outs) == ["good"] and len(outs["good"].output) == 3
    assert engine.runner.pool.num_free == engine.runner.pool.num_blocks - 1


@pytest.mark.parametrize("case", [2, 3, 4])
def test_hit_logprobs_follow_the_hit_reference_not_the_cold_one(tiny, cases, case):
    cfg, w = tiny
    prompt, hit, cached = cases[case]
    engine = Engine(cfg, w, EngineConfig(max_batch_tokens=97))
    engine.add_request(
        "r", prompt, SamplingParams(max_tokens=NEW, temperature=0, logprobs=True), cached=cached
    )
    out = next(o for o in engine.run_until_done() if o.finished)
    engine.close()
    tokens = prompt + out.output[:-1]
    rows = torch.arange(len(prompt) - 1, len(tokens))
    chosen = torch.tensor(out.output)

    def logprobs(h):
        logits = reference_logits(cfg, w, tokens, len(prompt), cfg.keep, from_pos=len(prompt) - 1, hit=h)
        return torch.log_softmax(logits[rows], -1)[torch.arange(NEW), chosen]

    got = torch.tensor(out.logprobs)
    assert torch.allclose(got, logprobs(hit), atol=1e-4, rtol=0)
    assert (got - logprobs(0)).abs().max() > 1e-3  # the replay really changes the numbers
