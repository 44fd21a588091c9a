"""Leases and flat state buffers for disaggregation, and full pages for persistence."""

import msgspec
import pytest
import torch

from dsi.engine import CachedPrefix, Engine, EngineConfig, RequestState, StateLayout
from dsi.engine.params import SamplingParams
from dsi.errors import InvalidRequest
from dsi.kvcache.hashchain import HashChain
from dsi.kvcache.layout import BlockLayout
from tests.dsi.engine.conftest import random_prompts
from tests.dsi.engine.test_prefix_hit import reference_with_hit

GREEDY = SamplingParams(max_tokens=6, temperature=0)


def _baseline(engine):
    return engine.runner.pool.num_free, engine.runner.slots.num_free


def _finished(engine):
    return {o.request_id: o for o in engine.run_until_done() if o.finished}


def _prefill(cfg, w, prompt, params, cached=None):
    engine = Engine(cfg, w)
    engine.add_request("r", prompt, params, prefill_only=True, cached=cached)
    first = _finished(engine)["r"]
    state = engine.export_request("r")
    assert _baseline(engine) == (engine.runner.pool.num_blocks - 1, engine.runner.slots.num_slots)
    engine.close()
    return first, state


def _wire(state):
    """What a data plane delivers: one contiguous read-only buffer, plus the encoded header."""
    header = msgspec.msgpack.encode(state.layout())
    return msgspec.msgpack.decode(header, type=StateLayout), bytes(
        b"".join(bytes(p) for p in state.to_parts())
    )


def _received(layout, buf, state):
    return RequestState.from_buffer(
        layout,
        buf,
        state.request_id,
        state.prompt,
        state.output,
        state.params,
        state.seed,
        state.consumer_start,
        state.num_computed,
        state.logprobs,
        state.num_cached,
        state.replay_start,
    )


def test_reserve_and_release_return_every_page_and_slot(tiny):
    cfg, w = tiny
    engine = Engine(cfg, w, EngineConfig(num_blocks=10, num_slots=2))
    base = _baseline(engine)
    res = engine.reserve(4)
    assert len(res.blocks) == 4 and _baseline(engine) == (base[0] - 4, base[1] - 1)
    with pytest.raises(InvalidRequest, match="cannot reserve"):
        engine.reserve(6)
    second = engine.reserve(0)
    with pytest.raises(InvalidRequest, match="cannot reserve"):
        engine.reserve(1)  # no state slot left
    engine.release(res)
    engine.release(res)  # idempotent
    engine.release(second)
    assert _baseline(engine) == base
    engine.close()


def test_state_buffer_round_trip_is_zero_copy(tiny):
    cfg, w = tiny
    _, state = _prefill(cfg, w, random_prompts([300], seed=61)[0], GREEDY)
    engine = Engine(cfg, w)
    shape = engine.shape
    assert shape.state_nbytes(3) == state.nbytes == sum(p.nbytes for p in state.to_parts())
    assert state.layout() == shape.state_layout(3) == StateLayout.of(cfg, 3)
    layout, buf = _wire(state)
    for how in (layout, shape.state_layout(3)):  # the sender's header, or the receiving engine's shape
        got = _received(how, buf, state)
        assert all(
            torch.equal(a, b)
            for a, b in zip(
                (got.pages, got.rings, got.partial), (state.pages, state.rings, state.partial), strict=True
            )
        )
    parts = got.to_parts()
    assert (
        parts[0].obj is not None
        and bytes(parts[1]) == buf[parts[0].nbytes : parts[0].nbytes + parts[1].nbytes]
    )
    with pytest.raises(ValueError, match="its layout says"):
        _received(shape.state_layout(3), buf[:-4], state)
    engine.close()


@pytest.mark.parametrize("extra_pages", [0, 2])
def test_import_into_a_reservation_matches_one_engine_and_frees_everything(tiny, extra_pages):
    cfg, w = tiny
    prompt = random_prompts([333], seed=62)[0]
    single = Engine(cfg, w)
    single.add_request("r", prompt, GREEDY)
    expected = _finished(single)["r"].output
    single.close()
    first, state = _prefill(cfg, w, prompt, GREEDY)
    assert first.output == expected[:1]
    decode = Engine(cfg, w)
    base = _baseline(decode)
    res = decode.reserve(3 + extra_pages)
    decode.import_request(_received(*_wire(state), state), res)
    assert not res.active
    decode.release(res)  # a no-op once imported
    assert _finished(decode)["r"].output == expected
    assert _baseline(decode) == base
    decode.close()


def test_bad_imports_leave_the_reservation_to_the_caller(tiny):
    cfg, w = tiny
    _, state = _prefill(cfg, w, random_prompts([300], seed=63)[0], GREEDY)
    engine = Engine(cfg, w)
    base = _baseline(engine)
    small = engine.reserve(2)
    with pytest.raises(InvalidRequest, match="cannot hold 3 pages"):
        engine.import_request(state, small)
    engine.release(small)
    wrong = RequestState(
        **{**{f: getattr(state, f) for f in RequestState.__slots__}, "rings": state.rings[:, :1]}
    )
    res = engine.reserve(3)
    with pytest.raises(InvalidRequest, match="model shape"):
        engine.import_request(wrong, res)
    engine.release(res)
    with pytest.raises(InvalidRequest, match="released"):
        engine.import_request(state, res)
    assert _baseline(engine) == base
    engine.close()


def _full_pages_of(cfg, w, prompt, max_tokens):
    engine = Engine(cfg, w, EngineConfig(collect_full_pages=True, max_batch_tokens=200))
    engine.add_request("r", prompt, SamplingParams(max_tokens=max_tokens, temperature=0))
    out = _finished(engine)["r"].output
    pages = engine.take_full_pages()
    assert engine.take_full_pages() == []
    engine.close()
    return out, pages


def test_full_pages_carry_the_chain_hash_of_prompt_and_output(tiny):
    cfg, w = tiny
    prompt = random_prompts([250], seed=64)[0]
    out, pages = _full_pages_of(cfg, w, prompt, 40)  # 290 tokens, 289 computed: pages 0 and 1
    chain = HashChain.of(cfg).hashes((prompt + out)[:256])
    assert [p.index for p in pages] == [0, 1] and {p.request_id for p in pages} == {"r"}
    assert b"".join(p.block_hash for p in pages) == chain
    assert all(p.data.shape == (BlockLayout(cfg).elems,) and p.data.dtype == torch.float32 for p in pages)


def test_persisted_pages_serve_a_hit_in_another_engine(tiny):
    cfg, w = tiny
    prompt = random_prompts([700], seed=65)[0]
    _, pages = _full_pages_of(cfg, w, prompt, 1)
    assert [p.index for p in pages] == [0, 1, 2, 3, 4]
    # Another process hashes the same prompt and finds the pages under the same keys.
    keys = HashChain.of(cfg).hashes(prompt[:640])
    by_hash = {p.block_hash: p.data for p in pages}
    found = [by_hash[keys[i : i + 16]] for i in range(0, len(keys), 16)]
    second = Engine(cfg, w)
    second.add_request("r", prompt, GREEDY, cached=CachedPrefix(640, torch.stack(found)))
    out = _finished(second)["r"].output
    second.close()
    assert reference_with_hit(cfg, w, prompt, out, 640) == out


def test_imported_requests_persist_their_pages_too(tiny):
    cfg, w = tiny
    prompt = random_prompts([300], seed=66)[0]
    params = SamplingParams(max_tokens=100, temperature=0, ignore_eos=True)
    expected, reference_pages = _full_pages_of(cfg, w, prompt, 100)
    _, state = _prefill(cfg, w, prompt, params)
    decode = Engine(cfg, w, EngineConfig(collect_full_pages=True))
    decode.import_request(state)
    early = decode.take_full_pages()  # the two full prompt pages, at import
    assert [p.index for p in early] == [0, 1]
    assert _finished(decode)["r"].output == expected
    pages = early + decode.take_full_pages()
    decode.close()
    assert [p.index for p in pages] == [0, 1, 2] == [p.index for p in reference_pages]
    assert [p.block_hash for p in pages] == [p.block_hash for p in reference_pages]
    assert all(torch.allclose(a.data, b.data, atol=1e-5) for a, b in zip(pages, reference_pages, strict=True))


def test_hit_prefill_then_decode_keeps_the_hit_semantics_even_when_preempted(tiny):
    cfg, w = tiny
    prompt = random_prompts([760], seed=67)[0]  # its 7th page fills at the 8th output token
    _, pages = _full_pages_of(cfg, w, prompt, 1)
    cached = CachedPrefix(640, torch.stack([p.data for p in pages[:5]]))
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    first, state = _prefill(cfg, w, prompt, params, cached)
    assert (state.num_cached, state.replay_start) == (640, 512)
    # 8 pages: the imported request holds 6 and needs a 7th while the other one holds the rest.
    decode = Engine(cfg, w, EngineConfig(num_blocks=9, max_batch_tokens=128))
    decode.import_request(_received(*_wire(state), state))
    decode.add_request(
        "other", random_prompts([600], seed=68)[0], SamplingParams(max_tokens=40, temperature=0)
    )
    out = _finished(decode)["r"].output
    assert decode.stats.last_request("r").computed_prompt_tokens == 760 - 512  # preempted: replayed from R
    decode.close()
    assert out[0] == first.output[0] and reference_with_hit(cfg, w, prompt, out, 640) == out
