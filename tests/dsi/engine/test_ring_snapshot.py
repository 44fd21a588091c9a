"""Exact prefix hits: ring snapshots captured by a cold run, loaded by a later hit, hit-free outputs."""

import pytest
import torch

from dsi.engine import CachedPrefix, Engine, EngineConfig
from dsi.engine.params import SamplingParams
from dsi.errors import InvalidRequest
from dsi.model.reference import consumer_start, exact_hit_limit, reference_logits
from tests.dsi.engine.conftest import random_prompts

NEW = 5
GREEDY = SamplingParams(max_tokens=NEW, temperature=0, logprobs=True)
TAIL = 150  # follow-up tokens after the hit: consumer_start = H + 10 >= H


def cold_run(cfg, w, prompt, max_tokens, **config):
    """A hit-free run that persists its pages and ring snapshot: (output, {index: FullPage}, [RingSnapshot])."""
    engine = Engine(cfg, w, EngineConfig(collect_full_pages=True, collect_ring_snapshots=True, **config))
    engine.add_request("cold", prompt, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
    out = next(o for o in engine.run_until_done() if o.finished)
    engine.close()
    return out.output, {p.index: p for p in engine.take_full_pages()}, engine.take_ring_snapshots()


def exact_prefix(cfg, pages, snap):
    h = snap.boundary
    assert pages[h // cfg.block_size - 1].block_hash == snap.block_hash
    return CachedPrefix(h, torch.stack([pages[i].data for i in range(h // cfg.block_size)]), snap.rings)


def run(cfg, w, requests, **config):
    """requests: [(prompt, cached or None)] -> (outputs, engine)."""
    engine = Engine(cfg, w, EngineConfig(**config))
    for i, (prompt, cached) in enumerate(requests):
        engine.add_request(str(i), prompt, GREEDY, cached=cached)
    done = {o.request_id: o for o in engine.run_until_done() if o.finished}
    pool, slots = engine.runner.pool, engine.runner.slots
    assert pool.num_free == pool.num_blocks - 1 and slots.num_free == slots.num_slots
    engine.close()
    return [done[str(i)] for i in range(len(requests))], engine


def assert_hit_free(cfg, w, prompt, out):
    """Greedy tokens are the hit-free reference's argmax and logprobs agree to 1e-4."""
    tokens = prompt + out.output[:-1]
    logits = reference_logits(cfg, w, tokens, len(prompt), cfg.keep, from_pos=len(prompt) - 1)[
        len(prompt) - 1 :
    ]
    assert logits.argmax(-1).tolist() == out.output
    ref = torch.log_softmax(logits, -1)[torch.arange(NEW), torch.tensor(out.output)]
    assert torch.allclose(torch.tensor(out.logprobs), ref, atol=1e-4, rtol=0)


# (prompt length, output tokens, max_batch_tokens) -> boundary of the snapshot
CAPTURES = {
    "prefill-mid-chunk": ((300, 3, 100), 256),  # chunk [200, 300) holds 256
    "prefill-chunk-ends-at-boundary": ((300, 3, 64), 256),  # [192, 256): keys < 192 from the ring
    "prefill-chunk-starts-at-boundary": ((300, 3, 128), 256),  # [128, 256), then [256, 300)
    "prefill-one-chunk": ((300, 3, 2048), 256),
    "decode": ((250, 10, 2048), 256),  # position 255 is the 6th output token's decode step
}


@pytest.fixture(scope="module")
def captured(tiny):
    cfg, w = tiny
    out = {}
    for name, ((n, new, mbt), boundary) in CAPTURES.items():
        prompt = random_prompts([n], seed=61)[0]
        output, pages, snaps = cold_run(cfg, w, prompt, new, max_batch_tokens=mbt, async_scheduling=False)
        assert [s.boundary for s in snaps] == [boundary]
        out[name] = (prompt + output, pages, snaps[0])
    return out


def test_snapshots_do_not_depend_on_chunking(tiny, captured):
    ref = captured["prefill-one-chunk"][2].rings
    assert ref.shape == (tiny[0].n_producer, 2, 128, tiny[0].n_kv_heads, tiny[0].head_dim)
    for name in CAPTURES:
        if name.startswith("prefill"):
            assert torch.allclose(captured[name][2].rings, ref, atol=1e-5, rtol=0), name
    assert not torch.equal(captured["decode"][2].rings, ref)  # different tokens before 256


@pytest.fixture(scope="module")
def follow_ups(tiny, captured):
    """Per capture: a follow-up prompt sharing the first H tokens, its exact hit, its hit-free output."""
    cfg, w = tiny
    tails = random_prompts([TAIL] * len(CAPTURES), seed=62)
    cases = []
    for (name, (tokens, pages, snap)), tail in zip(captured.items(), tails, strict=True):
        prompt = tokens[: snap.boundary] + tail
        assert snap.boundary <= exact_hit_limit(len(prompt), cfg.keep, cfg.block_size)
        cases.append((name, prompt, exact_prefix(cfg, pages, snap)))
    cold, _ = run(cfg, w, [(p, None) for _, p, _ in cases])
    return cases, [o.output for o in cold]


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_exact_hit_is_the_hit_free_run(tiny, follow_ups, async_scheduling):
    cfg, w = tiny
    cases, cold = follow_ups
    outs, engine = run(
        cfg, w, [(p, c) for _, p, c in cases], async_scheduling=async_scheduling, max_batch_tokens=97
    )
    assert [o.output for o in outs] == cold
    for (name, prompt, cached), out in zip(cases, outs, strict=True):
        assert_hit_free(cfg, w, prompt, out)
        st = engine.stats.last_request(str(cases.index((name, prompt, cached))))
        assert (st.cached_tokens, st.replay_tokens, st.computed_prompt_tokens) == (
            cached.num_tokens,
            0,
            len(prompt) - cached.num_tokens,
        )
    assert engine.stats.replay_tokens == 0


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_preempted_exact_hits_stay_exact(tiny, follow_ups, async_scheduling):
    cfg, w = tiny
    cases, _ = follow_ups
    # 510-token prompts: 4 pages, a 5th once decoding passes 512; 8 pages hold two such requests
    tails = random_prompts([510 - c.num_tokens for _, _, c in cases[:3]], seed=65)
    requests = [(p[: c.num_tokens] + t, c) for (_, p, c), t in zip(cases[:3], tails, strict=True)]
    cold, _ = run(cfg, w, [(p, None) for p, _ in requests])
    outs, engine = run(
        cfg, w, requests, num_blocks=9, max_batch_tokens=256, async_scheduling=async_scheduling
    )
    assert engine.scheduler.preemptions > 0
    assert [o.output for o in outs] == [o.output for o in cold]
    assert engine.stats.replay_tokens == 0


def test_async_extra_slice_does_not_move_the_snapshot(tiny):
    """Finishing with 256 tokens: async scheduling computes position 255 in a discarded slice;
    the snapshot is still the one the needed positions reached (128), as in sync mode."""
    cfg, w = tiny
    prompt = random_prompts([250], seed=63)[0]
    got = {}
    for mode in (True, False):
        output, _, snaps = cold_run(cfg, w, prompt, 6, async_scheduling=mode)
        assert len(prompt + output) == 256
        got[mode] = snaps
    assert [s.boundary for s in got[True]] == [s.boundary for s in got[False]] == [128]
    assert torch.allclose(got[True][0].rings, got[False][0].rings, atol=1e-6, rtol=0)


def test_hit_past_consumer_start_is_rejected_and_engine_keeps_serving(tiny, captured):
    cfg, w = tiny
    tokens, pages, snap = captured["prefill-mid-chunk"]
    prompt = tokens[: snap.boundary] + random_prompts([100], seed=64)[0]
    assert consumer_start(len(prompt), cfg.keep) < snap.boundary
    engine = Engine(cfg, w, EngineConfig(collect_ring_snapshots=True))
    engine.add_request("good", [7, 8, 9], SamplingParams(max_tokens=3, temperature=0))
    with pytest.raises(InvalidRequest, match="consumer_start"):
        engine.add_request("bad", prompt, GREEDY, cached=exact_prefix(cfg, pages, snap))
    with pytest.raises(InvalidRequest, match="rings must be float32"):
        engine.add_request(
            "bad",
            tokens[: snap.boundary] + [5] * TAIL,
            GREEDY,
            cached=CachedPrefix(snap.boundary, exact_prefix(cfg, pages, snap).pages, snap.rings[:2]),
        )
    # the fallback: the same pages without rings replay the window before the hit
    engine.add_request(
        "replay", prompt, GREEDY, cached=CachedPrefix(snap.boundary, exact_prefix(cfg, pages, snap).pages)
    )
    outs = {o.request_id: o for o in engine.run_until_done() if o.finished}
    engine.close()
    assert sorted(outs) == ["good", "replay"] and engine.stats.replay_tokens > 0
    assert engine.runner.pool.num_free == engine.runner.pool.num_blocks - 1


def test_exact_hit_without_decoder_replay_is_rejected(tiny, captured):
    cfg, w = tiny
    tokens, pages, snap = captured["prefill-mid-chunk"]
    assert exact_hit_limit(1000, None, cfg.block_size) == 0
    engine = Engine(cfg, w, EngineConfig(replay=False))
    with pytest.raises(InvalidRequest, match="consumer_start"):
        engine.add_request(
            "bad", tokens[: snap.boundary] + [5] * TAIL, GREEDY, cached=exact_prefix(cfg, pages, snap)
        )
    engine.close()


def test_exported_exact_hit_continues_exactly_and_leaves_its_snapshot(tiny, follow_ups):
    cfg, w = tiny
    cases, cold = follow_ups
    _, prompt, cached = cases[0]
    prefill = Engine(cfg, w, EngineConfig(collect_ring_snapshots=True, max_batch_tokens=97))
    prefill.add_request("r", prompt, GREEDY, prefill_only=True, cached=cached)
    prefill.run_until_done()
    state = prefill.export_request("r")
    snaps = prefill.take_ring_snapshots()
    prefill.close()
    assert (state.num_cached, state.replay_start) == (cached.num_tokens, cached.num_tokens)
    assert [s.boundary for s in snaps] == [len(prompt) // 128 * 128]
    assert prefill.stats.replay_tokens == 0 and prefill.stats.ring_snapshots == 1

    decode = Engine(cfg, w, EngineConfig(collect_ring_snapshots=True))
    decode.import_request(state)
    out = next(o for o in decode.run_until_done() if o.finished)
    decode.close()
    assert out.output == cold[0]
    assert decode.take_ring_snapshots() == []  # no boundary in [406, 411): the prefill host holds 384


def test_an_exact_hit_leaves_the_snapshot_a_hit_free_run_would(tiny, follow_ups):
    """Exact hits chain: the snapshot an exact-hit request takes at its next boundary is the cold one."""
    cfg, w = tiny
    cases, _ = follow_ups
    _, prompt, cached = cases[1]
    config = EngineConfig(collect_ring_snapshots=True, max_batch_tokens=97)
    snaps = []
    for hit in (cached, None):
        engine = Engine(cfg, w, config)
        engine.add_request("r", prompt, GREEDY, cached=hit)
        engine.run_until_done()
        engine.close()
        snaps += engine.take_ring_snapshots()
    exact, cold = snaps
    assert exact.boundary == cold.boundary == len(prompt) // 128 * 128 > cached.num_tokens
    assert exact.block_hash == cold.block_hash
    assert torch.allclose(exact.rings, cold.rings, atol=1e-5, rtol=0)


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_imported_exact_hit_preempted_recomputes_hit_free(tiny, follow_ups, async_scheduling):
    """The importer has no rings to reload: a preemption recomputes from 0, the same output."""
    cfg, w = tiny
    cases, _ = follow_ups
    _, prompt, cached = cases[0]
    prompt = prompt[: cached.num_tokens] + random_prompts([510 - cached.num_tokens], seed=66)[0]
    other = random_prompts([250], seed=67)[0]
    (cold, _), _ = run(cfg, w, [(prompt, None), (other, None)])
    prefill = Engine(cfg, w, EngineConfig(collect_ring_snapshots=True))
    prefill.add_request("r", prompt, GREEDY, prefill_only=True, cached=cached)
    prefill.run_until_done()
    state = prefill.export_request("r")
    prefill.close()
    decode = Engine(cfg, w, EngineConfig(num_blocks=7, async_scheduling=async_scheduling))
    decode.import_request(state)
    decode.add_request("other", other, GREEDY)
    outs = {o.request_id: o for o in decode.run_until_done() if o.finished}
    decode.close()
    assert decode.scheduler.preemptions > 0
    assert outs["r"].output == cold.output
