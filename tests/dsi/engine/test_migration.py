"""Live migration between two engines: full pages pre-copied while the request decodes, then the
tail (the pages written since, rings, partial state) in one batch; the continuation is the
undisturbed run's, token for token."""

import asyncio

import pytest

from dsi.engine import RequestMoved
from dsi.engine.engine import Engine, EngineConfig
from dsi.engine.params import SamplingParams
from dsi.engine.service import EngineService
from dsi.errors import InvalidRequest
from tests.dsi.engine.conftest import random_prompts

GREEDY = SamplingParams(max_tokens=10, temperature=0.0)
SEEDED = SamplingParams(max_tokens=10, temperature=0.8, seed=7)


def undisturbed(tiny, prompts, params):
    engine = Engine(*tiny, EngineConfig(async_scheduling=False))
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(str(i), prompt, p)
    done = {o.request_id: o.output for o in engine.run_until_done() if o.finished}
    engine.close()
    return [done[str(i)] for i in range(len(prompts))]


async def migrate(tiny, prompts, params, precopy: bool):
    src = EngineService(Engine(*tiny, EngineConfig(num_blocks=64, async_scheduling=False)))
    dst = EngineService(Engine(*tiny, EngineConfig(num_blocks=64, async_scheduling=False)))
    src.start()
    dst.start()
    base = dst.load.free_pages, dst.load.free_slots
    streams = [
        src.generate(str(i), prompt, p) for i, (prompt, p) in enumerate(zip(prompts, params, strict=True))
    ]
    firsts = [await anext(s) for s in streams]  # every request has run (prompt + one token)
    held, reservations = {}, {}
    for i in range(len(prompts)):
        pages = await src.full_pages_of(str(i), 0)  # pre-copy, the requests keep decoding
        reservations[str(i)] = res = await dst.reserve(0)
        await dst.grow_reservation(res, pages.shape[0] if precopy else 0)
        if precopy:
            dst.write_pages(res, 0, pages)
        held[str(i)] = pages.shape[0] if precopy else 0
    states = await src.export_batch(held)
    outputs = []
    for i, s in enumerate(streams):
        got = list(firsts[i].new_tokens)
        with pytest.raises(RequestMoved):
            async for out in s:
                got += out.new_tokens
        state = states[str(i)]
        assert not isinstance(state, Exception)
        assert got == state.output[: len(got)]  # what streamed is a prefix of what moved
        res = reservations[str(i)]
        await dst.grow_reservation(res, held[str(i)] + state.pages.shape[0])
        rest = [t async for out in dst.import_request(state, res, held[str(i)]) for t in out.new_tokens]
        outputs.append(state.output + rest)
    assert src.load.free_pages == src.shape.num_pages and src.load.free_slots == src.shape.num_slots
    assert (dst.load.free_pages, dst.load.free_slots) == base
    await src.close()
    await dst.close()
    return outputs


def test_a_migrated_request_continues_as_the_undisturbed_run(tiny):
    prompts = random_prompts([300, 140, 260], seed=5)
    params = [GREEDY, SEEDED, GREEDY]
    assert asyncio.run(migrate(tiny, prompts, params, precopy=True)) == undisturbed(tiny, prompts, params)


def test_pre_copied_pages_must_fit_and_cover_the_state(tiny):
    engine = Engine(*tiny, EngineConfig(num_blocks=16, async_scheduling=False))
    engine.add_request("a", random_prompts([300], seed=1)[0], GREEDY)
    engine.step()
    full = engine.full_pages_of("a", 0)
    assert full.shape[0] == 2  # 300 positions: two full pages of 128
    with pytest.raises(InvalidRequest, match="cannot be skipped"):
        engine.export_request("a", skip=3)
    state = engine.export_request("a", skip=2)
    assert state.pages.shape[0] == 1
    other = Engine(*tiny, EngineConfig(num_blocks=16, async_scheduling=False))
    res = other.reserve(2)
    with pytest.raises(InvalidRequest, match="do not fit"):
        other.write_pages(res, 1, full)
    with pytest.raises(InvalidRequest, match="do not cover"):
        other.import_request(state, res, held=1)
    with pytest.raises(InvalidRequest, match="cannot reserve"):
        other.grow_reservation(res, 100)
    other.release(res)
    assert other.runner.pool.num_free == 15
    engine.close()
    other.close()
