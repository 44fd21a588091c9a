"""The engine runs the Gemma 3 family (tiny seeded shape): paged global layers and SWA rings
match the naive reference, chunked and batched; exact hits give the hit-free output; bounded
replay hits give the reference's output with the hit; a state crosses engines with its rings."""

import random

import pytest
import torch

from dsi.engine import CachedPrefix, Engine, EngineConfig, SamplingParams
from dsi.engine.transfer import StateLayout
from dsi.model.gemma3_reference import gemma3_logits
from tests.gemma3 import TINY_GEMMA3 as CFG
from tests.gemma3 import tiny_weights
from tests.smollm2 import one_torch_thread

NEW = 4
LENGTHS = (1, 159, 161, 300, 520)  # around the window (160) and page (128) edges


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def weights():
    return tiny_weights()


def _prompts(lengths=LENGTHS, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(512) for _ in range(n)] for n in lengths]


def _config(**kw):
    base = dict(num_blocks=24, num_slots=6, max_running=6, max_batch_tokens=96, async_scheduling=False)
    return EngineConfig(**(base | kw))


def _run(engine, prompts, cached=None):
    params = SamplingParams(max_tokens=NEW, temperature=0, ignore_eos=True, logprobs=True)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params, cached=None if cached is None else cached[i])
    done = {o.request_id: o for o in engine.run_until_done() if o.finished}
    return [(done[str(i)].output, done[str(i)].logprobs) for i in range(len(prompts))]


def _reference(w, prompt, output, hit=0):
    """Teacher-forced reference: (argmax, logprob of the engine's token) at each generated position."""
    logits = gemma3_logits(CFG, w, prompt + output[:-1], len(prompt), hit, from_pos=len(prompt) - 1)
    logp = torch.log_softmax(logits, -1)
    return logits.argmax(-1).tolist(), logp[torch.arange(len(output)), torch.tensor(output)].tolist()


@pytest.mark.parametrize("batch_invariant", [True, False])
@pytest.mark.parametrize("attention", ["kernel", "torch"])
def test_engine_matches_the_reference_chunked_and_batched(weights, batch_invariant, attention, monkeypatch):
    """With the C attention kernel where it is built, and with the torch paths it falls back to."""
    if attention == "torch":
        monkeypatch.setenv("DSI_NATIVE_KERNELS", "0")
    prompts = _prompts()
    engine = Engine(CFG, weights, _config(batch_invariant=batch_invariant))
    try:
        if attention == "kernel" and engine.runner._native is None:
            pytest.skip("the C attention kernel is not built here")
        assert (engine.runner._native is not None) == (attention == "kernel")
        got = _run(engine, prompts)
        assert engine.load().free_pages == 23  # every page came back
    finally:
        engine.close()
    for p, (out, lp) in zip(prompts, got, strict=True):
        greedy, ref_lp = _reference(weights, p, out)
        assert out == greedy
        torch.testing.assert_close(torch.tensor(lp), torch.tensor(ref_lp), atol=1e-4, rtol=0)


def _cold_with_pages(weights, prompts):
    engine = Engine(CFG, weights, _config(collect_full_pages=True, collect_ring_snapshots=True))
    try:
        out = _run(engine, prompts)
        pages = {(int(p.request_id), p.index): p.data for p in engine.take_full_pages()}
        snaps = {int(s.request_id): s for s in engine.take_ring_snapshots()}
    finally:
        engine.close()
    return out, pages, snaps


def test_exact_hits_give_the_hit_free_output_and_bounded_hits_the_reference_with_the_hit(weights):
    """H = the last block boundary of each prompt (the one its cold run's ring snapshot holds):
    loading the pages and the sliding rings computes from H and gives the cold run's bits;
    the pages alone replay [H - window, H) and give the reference's output with a hit of H."""
    prompts = _prompts((200, 300, 420, 520), seed=3)
    cold, pages, snaps = _cold_with_pages(weights, prompts)
    hits = [(len(p) - 1) // 128 * 128 for p in prompts]
    assert [snaps[i].boundary for i in range(len(prompts))] == hits
    assert snaps[0].rings.shape == (6, 2, 160, 2, 16)  # every sliding layer's last window
    stacked = [torch.stack([pages[i, b] for b in range(h // 128)]) for i, h in enumerate(hits)]
    engine = Engine(CFG, weights, _config())
    try:
        exact = _run(
            engine,
            prompts,
            [CachedPrefix(h, s, snaps[i].rings) for i, (h, s) in enumerate(zip(hits, stacked, strict=True))],
        )
        stats = [engine.request_stats(str(i)) for i in range(len(prompts))]
    finally:
        engine.close()
    assert exact == cold  # tokens and logprobs, bit for bit
    assert [s.replay_tokens for s in stats] == [0] * 4
    assert [s.computed_prompt_tokens for s in stats] == [
        len(p) - h for p, h in zip(prompts, hits, strict=True)
    ]
    engine = Engine(CFG, weights, _config())
    try:
        bounded = _run(engine, prompts, [CachedPrefix(h, s) for h, s in zip(hits, stacked, strict=True)])
        stats = [engine.request_stats(str(i)) for i in range(len(prompts))]
    finally:
        engine.close()
    assert [s.replay_tokens for s in stats] == [min(h, 160) for h in hits]  # R = max(0, H - 160)
    for p, h, (out, lp) in zip(prompts, hits, bounded, strict=True):
        greedy, ref_lp = _reference(weights, p, out, hit=h)
        assert out == greedy
        torch.testing.assert_close(torch.tensor(lp), torch.tensor(ref_lp), atol=1e-4, rtol=0)
    assert [o for o, _ in bounded] != [o for o, _ in cold]  # the replay changes this model's output


def test_a_state_continues_in_another_engine_with_its_rings(weights):
    """The PD handoff: pages hold the global layer, the state's rings the sliding layers."""
    prompt = _prompts((300,), seed=5)[0]
    [(expected, _)] = _run_one(weights, prompt)
    layout = StateLayout.of(CFG, 3)
    assert dict((b.name, b.shape) for b in layout.buffers) == {
        "pages": (3, 1 * 2 * 128 * 2 * 16),  # one global layer
        "rings": (6, 2, 166, 2, 16),  # six sliding layers, window + 6
        "partial": (0, 16),
    }
    prefill, decode = Engine(CFG, weights, _config()), Engine(CFG, weights, _config())
    try:
        params = SamplingParams(max_tokens=NEW, temperature=0, ignore_eos=True)
        prefill.add_request("r", prompt, params, prefill_only=True)
        prefill.run_until_done()
        state = prefill.export_request("r")
        assert state.rings.abs().sum() > 0
        decode.import_request(state)
        out = next(o for o in decode.run_until_done() if o.finished).output
    finally:
        prefill.close()
        decode.close()
    assert out == expected


def _run_one(weights, prompt):
    engine = Engine(CFG, weights, _config())
    try:
        return _run(engine, [prompt])
    finally:
        engine.close()
