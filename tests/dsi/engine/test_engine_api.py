"""Sampling determinism, bad input, and disaggregated export / import."""

import math

import pytest

from dsi.engine.engine import Engine, EngineConfig
from dsi.engine.params import SamplingParams
from dsi.errors import InvalidRequest
from tests.dsi.engine.conftest import random_prompts

SEEDED = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, top_k=200, min_p=0.01, seed=1234)


def _outputs(engine):
    return {o.request_id: o for o in engine.run_until_done() if o.finished}


def test_seeded_sampling_ignores_batch_composition(tiny):
    cfg, w = tiny
    prompt = random_prompts([300], seed=11)[0]
    alone = Engine(cfg, w)
    alone.add_request("x", prompt, SEEDED)
    solo = _outputs(alone)["x"].output
    alone.close()
    crowd = Engine(cfg, w, EngineConfig(max_batch_tokens=256))
    for i, other in enumerate(random_prompts([50, 700, 3, 1000, 129], seed=12)):
        crowd.add_request(f"o{i}", other, SamplingParams(max_tokens=20, temperature=1.0, seed=i))
    crowd.add_request("x", prompt, SEEDED)
    assert _outputs(crowd)["x"].output == solo
    crowd.close()
    assert len(set(solo)) > 1  # really sampled, not a constant


def test_different_seeds_differ(tiny):
    cfg, w = tiny
    prompt = random_prompts([40], seed=13)[0]
    engine = Engine(cfg, w)
    for seed in range(4):
        engine.add_request(str(seed), prompt, SamplingParams(max_tokens=8, temperature=1.5, seed=seed))
    outs = _outputs(engine)
    engine.close()
    assert len({tuple(o.output) for o in outs.values()}) > 1


@pytest.mark.parametrize(
    ("prompt", "params", "match"),
    [
        ([], SamplingParams(), "empty"),
        ([5, 129_280], SamplingParams(), "token ids"),
        ([5, -1], SamplingParams(), "token ids"),
        ([5, 1.5], SamplingParams(), "token ids"),
        ([5], SamplingParams(max_tokens=0), "max_tokens"),
        ([5], SamplingParams(max_tokens=-3), "max_tokens"),
        ([5], SamplingParams(temperature=math.nan), "temperature"),
        ([5], SamplingParams(temperature=-0.1), "temperature"),
        ([5], SamplingParams(top_p=0), "top_p"),
        ([5], SamplingParams(top_k=-1), "top_k"),
        ([5], SamplingParams(min_p=2), "min_p"),
        ([5], SamplingParams(top_logprobs=99), "top_logprobs"),
        ([5] * 16_384, SamplingParams(), "context limit"),
    ],
)
def test_bad_input_is_rejected_and_engine_keeps_serving(tiny, prompt, params, match):
    cfg, w = tiny
    engine = Engine(cfg, w)
    engine.add_request("good", [7, 8, 9], SamplingParams(max_tokens=3, temperature=0))
    with pytest.raises(InvalidRequest, match=match):
        engine.add_request("bad", prompt, params)
    outs = _outputs(engine)
    engine.close()
    assert list(outs) == ["good"] and len(outs["good"].output) == 3


def test_duplicate_request_id_is_rejected(tiny):
    cfg, w = tiny
    engine = Engine(cfg, w)
    engine.add_request("a", [1, 2], SamplingParams(max_tokens=2))
    with pytest.raises(InvalidRequest, match="already in use"):
        engine.add_request("a", [1, 2], SamplingParams(max_tokens=2))
    engine.close()


def test_abort_frees_cache(tiny):
    cfg, w = tiny
    engine = Engine(cfg, w)
    engine.add_request("a", random_prompts([500], seed=2)[0], SamplingParams(max_tokens=50, temperature=0))
    engine.step()
    engine.step()
    assert engine.abort("a")
    outs = engine.run_until_done()
    assert any(o.request_id == "a" and o.finish_reason == "abort" for o in outs)
    assert engine.runner.pool.num_free == engine.runner.pool.num_blocks - 1
    engine.close()


@pytest.mark.parametrize(
    "params", [SamplingParams(max_tokens=10, temperature=0), SEEDED], ids=["greedy", "seeded"]
)
def test_prefill_only_then_decode_only_matches_one_engine(tiny, params):
    cfg, w = tiny
    prompt = random_prompts([333], seed=21)[0]
    single = Engine(cfg, w)
    single.add_request("r", prompt, params)
    expected = _outputs(single)["r"].output
    single.close()

    prefill = Engine(cfg, w)
    prefill.add_request("r", prompt, params, prefill_only=True)
    first = _outputs(prefill)["r"]
    assert first.finish_reason == "prefilled" and first.output == expected[:1]
    state = prefill.export_request("r")
    assert prefill.runner.pool.num_free == prefill.runner.pool.num_blocks - 1
    assert state.buffers()["pages"][0] == (3, prefill.runner.layout.elems)
    prefill.close()

    decode = Engine(cfg, w)
    decode.import_request(state)
    assert _outputs(decode)["r"].output == expected
    decode.close()


def test_mid_decode_migration_matches_one_engine(tiny):
    cfg, w = tiny
    prompt = random_prompts([260], seed=22)[0]
    params = SamplingParams(max_tokens=16, temperature=0.7, seed=5)
    single = Engine(cfg, w)
    single.add_request("r", prompt, params)
    expected = _outputs(single)["r"].output
    single.close()

    source = Engine(cfg, w)
    source.add_request("r", prompt, params)
    for _ in range(6):
        source.step()
    state = source.export_request("r")
    assert 0 < len(state.output) < 16
    source.close()
    target = Engine(cfg, w, EngineConfig(async_scheduling=False))
    target.import_request(state)
    assert _outputs(target)["r"].output == expected
    target.close()


def test_full_pages_carry_their_chain_hash(tiny):
    from dsi.kvcache.hashchain import HashChain

    cfg, w = tiny
    prompt = random_prompts([300], seed=41)[0]
    engine = Engine(cfg, w, EngineConfig(max_batch_tokens=100))
    engine.add_request("r", prompt, SamplingParams(max_tokens=4, temperature=0))
    req = engine.requests["r"]
    while not req.output:
        engine.step()
    expected = HashChain.of(cfg).hashes(prompt)
    assert b"".join(req.block_hashes) == expected and len(req.block_hashes) == 2
    pool = engine.runner.pool
    assert [pool.hash_of(b) for b in req.block_table[:2]] == req.block_hashes
    engine.run_until_done()
    engine.close()
    # Freed pages keep their hash (findable for reuse) until they are allocated again.
    assert pool.lookup(req.block_hashes[0]) is not None
