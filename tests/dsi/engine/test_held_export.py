"""A held export: the state views the pool's pages (no copy) and the pages stay out of the free
list until released; its bytes are those of a copying export."""

import torch

from dsi.engine.engine import Engine, EngineConfig
from dsi.engine.params import SamplingParams
from dsi.engine.transfer import RequestState
from tests.dsi.engine.conftest import random_prompts


def _prefilled(tiny, n: int) -> Engine:
    cfg, w = tiny
    engine = Engine(cfg, w, EngineConfig(num_blocks=40))
    for i, p in enumerate(random_prompts([300] * n, seed=41)):
        engine.add_request(str(i), p, SamplingParams(max_tokens=4, temperature=0), prefill_only=True)
    while engine.has_unfinished():
        engine.step()
    return engine


def test_a_held_export_sends_the_bytes_of_a_copy_and_holds_its_pages_until_released(tiny):
    engine = _prefilled(tiny, 2)
    try:
        pool = engine.runner.pool
        copied = engine.export_request("0")
        free = pool.num_free
        held = engine.export_request("1", hold=True)
        assert held.held and len(held.page_rows) == len(held.held) == held.pages.shape[0]
        assert held.pages.device.type == "meta" and held.layout() == copied.layout()
        assert pool.num_free == free  # exported, yet its pages are not free
        assert held.page_rows[0].data_ptr() == pool.pages[held.held[0]].data_ptr()  # views, no copy
        got = b"".join(bytes(p) for p in held.to_parts())
        assert len(got) == held.nbytes
        back = RequestState.from_buffer(
            held.layout(), bytearray(got), "1", held.prompt, held.output, held.params, held.seed,
            held.consumer_start, held.num_computed, held.logprobs,
        )  # fmt: skip
        assert torch.equal(back.pages, pool.pages[list(held.held)])
        engine.release_held(held.held)
        assert pool.num_free == free + len(held.held)
    finally:
        engine.close()
