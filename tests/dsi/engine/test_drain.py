"""Calls that drain the step in flight (export, import) between asynchronous steps."""

import asyncio

from dsi.engine.engine import Engine, EngineConfig
from dsi.engine.params import SamplingParams
from dsi.engine.service import EngineService
from dsi.engine.transfer import RequestState
from tests.dsi.engine.conftest import random_prompts

GREEDY = SamplingParams(max_tokens=12, temperature=0.0)


def offline(tiny, prompts):
    engine = Engine(*tiny, EngineConfig(async_scheduling=False))
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, GREEDY)
    done = {o.request_id: o.output for o in engine.run_until_done() if o.finished}
    engine.close()
    return [done[str(i)] for i in range(len(prompts))]


def test_an_export_mid_decode_reports_every_token_of_the_others_once(tiny):
    a, b = random_prompts([295, 93], seed=3)
    engine = Engine(*tiny, EngineConfig())
    engine.add_request("a", a, GREEDY)
    got, steps = [], 0
    while engine.has_unfinished():
        got += [t for o in engine.step() if o.request_id == "a" for t in o.new_tokens]
        steps += 1
        if steps == 3:
            engine.add_request("b", b, GREEDY, prefill_only=True)
        if steps == 6:
            engine.export_request("b")  # drains the step in flight
    engine.close()
    assert got == offline(tiny, [a])[0]


async def test_many_handoffs_between_two_services_match_one_engine(tiny):
    prompts = random_prompts([1, 40, 130, 300, 511, 700] * 3, seed=4)
    prefill, decode = EngineService(Engine(*tiny)), EngineService(Engine(*tiny))
    prefill.start()
    decode.start()

    async def one(i, prompt):
        rid = f"h{i}"
        first = [o async for o in prefill.generate(rid, prompt, GREEDY, prefill_only=True)]
        assert first[-1].finish_reason == "prefilled"
        state = await prefill.export(rid)
        buf = bytearray(b"".join(bytes(p) for p in state.to_parts()))
        reservation = await decode.reserve(state.pages.shape[0])
        moved = RequestState.from_buffer(
            decode.shape.state_layout(state.pages.shape[0]),
            buf,
            rid,
            prompt,
            state.output,
            GREEDY,
            state.seed,
            state.consumer_start,
            state.num_computed,
            state.logprobs,
        )
        tokens = list(state.output)
        async for out in decode.import_request(moved, reservation):
            tokens += out.new_tokens
        return tokens

    try:
        got = await asyncio.wait_for(asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))), 120)
    finally:
        await prefill.close()
        await decode.close()
    assert got == offline(tiny, prompts)
    assert decode.load.free_pages == decode.shape.num_pages
    assert prefill.load.free_pages == prefill.shape.num_pages
