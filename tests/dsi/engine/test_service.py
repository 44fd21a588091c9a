import asyncio

import pytest

from dsi.engine.engine import Engine, EngineConfig
from dsi.engine.params import SamplingParams
from dsi.engine.service import EngineService
from dsi.errors import InvalidRequest
from tests.dsi.engine.conftest import random_prompts


@pytest.fixture
async def service(tiny):
    cfg, w = tiny
    svc = EngineService(Engine(cfg, w, EngineConfig()))
    svc.start()
    yield svc
    await svc.close()


async def _collect(svc, rid, prompt, params):
    return [o async for o in svc.generate(rid, prompt, params)]


async def test_concurrent_streams_match_offline_engine(service, tiny):
    cfg, w = tiny
    prompts = random_prompts([10, 200, 3, 150], seed=31)
    params = SamplingParams(max_tokens=6, temperature=0)
    outs = await asyncio.gather(*(_collect(service, str(i), p, params) for i, p in enumerate(prompts)))
    offline = Engine(cfg, w)
    for i, p in enumerate(prompts):
        offline.add_request(str(i), p, params)
    expected = {o.request_id: o.output for o in offline.run_until_done() if o.finished}
    offline.close()
    for i, chunks in enumerate(outs):
        assert chunks[-1].finished and chunks[-1].output == expected[str(i)]
        assert [t for c in chunks for t in c.new_tokens] == expected[str(i)]


async def test_refused_request_raises_and_others_go_on(service):
    with pytest.raises(InvalidRequest):
        await _collect(service, "bad", [], SamplingParams())
    good = await _collect(service, "good", [5, 6, 7], SamplingParams(max_tokens=2, temperature=0))
    assert good[-1].finished


async def test_leaving_the_stream_aborts_and_frees(service):
    prompt = random_prompts([300], seed=32)[0]
    stream = service.generate("long", prompt, SamplingParams(max_tokens=500, temperature=0))
    await stream.__anext__()
    await stream.aclose()
    for _ in range(200):
        if not service.engine.has_unfinished():
            break
        await asyncio.sleep(0.02)
    pool = service.engine.runner.pool
    assert not service.engine.has_unfinished() and pool.num_free == pool.num_blocks - 1
