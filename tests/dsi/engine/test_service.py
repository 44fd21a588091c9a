import asyncio
import threading
import time

import pytest

from dsi.engine.engine import Engine, EngineConfig
from dsi.engine.params import SamplingParams
from dsi.engine.service import EngineService, RequestMoved, step_thread
from dsi.errors import InvalidRequest
from tests.dsi.engine.conftest import random_prompts


@pytest.fixture
async def service(tiny):
    cfg, w = tiny
    svc = EngineService(Engine(cfg, w, EngineConfig()))
    svc.start()
    yield svc
    await svc.close()


async def _collect(svc, rid, prompt, params, **kw):
    return [o async for o in svc.generate(rid, prompt, params, **kw)]


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
        if service.load.running == 0 and service.load.free_pages == service.shape.num_pages:
            break
        await asyncio.sleep(0.02)
    assert service.load.running == service.load.waiting == 0
    assert service.load.free_pages == service.shape.num_pages


async def test_prefill_service_hands_a_request_to_a_decode_service(tiny):
    from dsi.engine import RequestState

    cfg, w = tiny
    prompt = random_prompts([300], seed=33)[0]
    params = SamplingParams(max_tokens=8, temperature=0)
    offline = Engine(cfg, w)
    offline.add_request("r", prompt, params)
    expected = next(o for o in offline.run_until_done() if o.finished).output
    offline.close()
    prefill = EngineService(Engine(cfg, w))
    decode = EngineService(Engine(cfg, w, EngineConfig(collect_full_pages=True)))
    prefill.start()
    decode.start()
    try:
        first = await _collect(prefill, "r", prompt, params, prefill_only=True)
        assert [o.finish_reason for o in first] == ["prefilled"] and first[0].output == expected[:1]
        state = await prefill.export("r")
        base = await decode.call(lambda e: (e.runner.pool.num_free, e.runner.slots.num_free))
        res = await decode.reserve(3)
        buf = bytearray(b"".join(bytes(p) for p in state.to_parts()))
        received = RequestState.from_buffer(
            decode.shape.state_layout(3),
            buf,
            "r",
            prompt,
            state.output,
            params,
            state.seed,
            state.consumer_start,
            state.num_computed,
            state.logprobs,
        )
        stream = decode.import_request(received, res)
        buf[:] = bytes(len(buf))  # the receive buffer is reused as soon as import_request returns
        outs = [o async for o in stream]
        assert outs[-1].output == expected
        assert [p.index for p in decode.take_full_pages()] == [0, 1]
        assert await decode.call(lambda e: (e.runner.pool.num_free, e.runner.slots.num_free)) == base
        free = await prefill.call(lambda e: e.runner.pool.num_free)
        assert free == prefill.shape.num_pages == prefill.load.free_pages
    finally:
        await prefill.close()
        await decode.close()


async def test_call_returns_results_and_errors_and_refused_imports_release(service):
    assert await service.call(lambda e: e.cfg.name) == "tiny"
    with pytest.raises(InvalidRequest, match="cannot reserve"):
        await service.reserve(10**6)
    with pytest.raises(InvalidRequest, match="no cache"):
        await service.export("nobody")
    base = await service.call(lambda e: e.runner.pool.num_free)
    await _collect(
        service,
        "dup",
        [5, 6, 7],
        SamplingParams(max_tokens=40, temperature=0, ignore_eos=True),
        prefill_only=True,
    )
    state = await service.export("dup")
    service_gen = service.generate(
        "dup", [1, 2, 3], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    )
    first = await service_gen.__anext__()  # "dup" is running: an import under the same id is refused
    res = await service.reserve(1)
    with pytest.raises(InvalidRequest, match="already in use"):
        await _collect_stream(service.import_request(state, res))
    assert not res.active
    assert first.new_tokens
    await service_gen.aclose()
    for _ in range(100):
        if await service.call(lambda e: e.runner.pool.num_free) == base:
            break
    assert await service.call(lambda e: e.runner.pool.num_free) == base


async def _collect_stream(stream):
    return [o async for o in stream]


async def test_load_and_request_stats_come_through_the_service(service):
    assert service.load.free_pages == service.shape.num_pages and service.load.running == 0
    prompt = random_prompts([300], seed=34)[0]
    first = await _collect(
        service, "p", prompt, SamplingParams(max_tokens=4, temperature=0), prefill_only=True
    )
    assert first[-1].finish_reason == "prefilled"
    assert service.request_stats("p").computed_prompt_tokens == 300  # held by the engine, not freed yet
    assert service.load.free_pages <= service.shape.num_pages - service.shape.blocks(300)
    await service.export("p")
    await _collect(service, "d", [5, 6, 7], SamplingParams(max_tokens=3, temperature=0))
    assert service.request_stats("d").computed_prompt_tokens == 3  # its pages may be freed a step later
    assert service.request_stats("nobody") is None
    load = service.load
    assert (load.running, load.prompt_tokens, load.computed_prompt_tokens, load.cached_tokens) == (
        0,
        303,
        303,
        0,
    )


async def test_the_finished_hook_runs_before_the_final_output_is_read(tiny):
    cfg, w = tiny
    svc = EngineService(Engine(cfg, w, EngineConfig(collect_ring_snapshots=True)))
    snapshots: list = []
    svc.on_finished = lambda: snapshots.extend(svc.take_ring_snapshots())
    svc.start()
    try:
        prompt = random_prompts([300], seed=5)[0]
        async for out in svc.generate("a", prompt, SamplingParams(max_tokens=4, temperature=0)):
            if out.finished:  # the request's ring snapshot was taken before this was read
                assert [s.request_id for s in snapshots] == ["a"]
            else:
                assert snapshots == []
    finally:
        await svc.close()


async def test_calls_that_wait_on_the_step_in_flight_leave_the_event_loop_free(tiny):
    """With async scheduling a step is in flight between two ``step`` calls, and an export, an
    import or a page copy waits for it; that wait is on the engine's thread, so the event loop
    keeps running (here each forward takes 0.3 s, and the loop never stalls for 0.15 s)."""
    cfg, w = tiny
    engine = Engine(cfg, w, EngineConfig(async_scheduling=True))
    forward = engine.runner.forward

    def slow(*args, **kwargs):
        time.sleep(0.3)
        return forward(*args, **kwargs)

    engine.runner.forward = slow
    svc = EngineService(engine)
    svc.start()
    loop = asyncio.get_running_loop()
    worst = [0.0]

    async def ticker() -> None:
        while True:
            t = loop.time()
            await asyncio.sleep(0.01)
            worst[0] = max(worst[0], loop.time() - t - 0.01)

    stream = svc.generate("r", [5, 6, 7], SamplingParams(max_tokens=50, temperature=0, ignore_eos=True))
    try:
        await stream.__anext__()  # decoding: from here a step is in flight between steps
        tick = asyncio.ensure_future(ticker())
        t0 = loop.time()
        pages = await svc.full_pages_of("r", 0)
        state = (await svc.export_batch({"r": 0}))["r"]
        waited = loop.time() - t0
        tick.cancel()
        with pytest.raises(RequestMoved):
            async for _ in stream:
                pass
    finally:
        await stream.aclose()
        await svc.close()
    assert pages.shape[0] == 0 and state.num_computed >= 4
    assert waited >= 0.3 and worst[0] < 0.15, (waited, worst[0])


async def test_an_engine_built_in_its_step_thread_is_stepped_there(tiny):
    """What engine roles do (one OpenMP team per process, see step_thread)."""
    cfg, w = tiny
    thread = step_thread()
    built: list[int] = []

    def build() -> EngineService:
        built.append(threading.get_ident())
        return EngineService.create(cfg, w, EngineConfig(), thread=thread)

    svc = await asyncio.get_running_loop().run_in_executor(thread, build)
    stepped: set[int] = set()
    step = svc._engine.step

    def recorded():
        stepped.add(threading.get_ident())
        return step()

    svc._engine.step = recorded  # type: ignore[method-assign]
    svc.start()
    try:
        await _collect(svc, "r", [5, 6, 7], SamplingParams(max_tokens=3, temperature=0))
    finally:
        await svc.close()
    assert stepped == set(built) and threading.get_ident() not in stepped


async def test_a_burst_at_an_idle_engine_shares_one_first_step_and_a_lone_request_is_not_held(tiny):
    cfg, w = tiny
    svc = EngineService(Engine(cfg, w, EngineConfig()), gather_s=0.05)
    svc.start()
    try:
        params = SamplingParams(max_tokens=1, temperature=0)
        prompts = random_prompts([12] * 6, seed=33)
        t0 = time.monotonic()
        await _collect(svc, "alone", prompts[0], params)
        assert svc.gathers == 0 and time.monotonic() - t0 < 5  # stepped at once
        steps = svc.steps
        await asyncio.sleep(0.2)  # so that the burst's first request comes alone

        async def late(i: int) -> list:
            await asyncio.sleep(0.01 * i)  # a burst: each 10 ms after the one before
            return await _collect(svc, str(i), prompts[i], params)

        outs = await asyncio.gather(*(late(i) for i in range(1, 6)))
        assert all(o[-1].finished for o in outs)
        # the first steps alone at once; the other four, 10 ms apart, share the next step (held
        # for them, or admitted together after a first step that outlasted their arrivals)
        assert svc.steps - steps == 2 and svc.gathers <= 1
    finally:
        await svc.close()
