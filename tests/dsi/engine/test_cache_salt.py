"""A cache salt namespaces a request's pages and SWA states: its own chain root."""

from dsi.engine.engine import Engine, EngineConfig
from dsi.engine.params import SamplingParams
from dsi.kvcache.hashchain import HASH_BYTES, HashChain
from tests.dsi.engine.conftest import random_prompts


def run(tiny, prompt, salt):
    engine = Engine(
        *tiny, EngineConfig(async_scheduling=False, collect_full_pages=True, collect_ring_snapshots=True)
    )
    engine.add_request("r", prompt, SamplingParams(max_tokens=40, temperature=0.0, cache_salt=salt))
    out = next(o for o in engine.run_until_done() if o.finished).output
    pages, states = engine.take_full_pages(), engine.take_ring_snapshots()
    engine.close()
    return out, sorted(pages, key=lambda p: p.index), states


def test_salted_pages_and_states_hash_under_the_salted_chain(tiny):
    cfg, _ = tiny
    (prompt,) = random_prompts([300], seed=21)
    plain_out, plain_pages, _ = run(tiny, prompt, "")
    out, pages, states = run(tiny, prompt, "tenant-a")
    assert out == plain_out  # the salt changes where pages are found, never the computation
    tokens = prompt + out
    want = HashChain.of(cfg).hashes(tokens[: len(pages) * cfg.block_size], cache_salt="tenant-a")
    assert [p.block_hash for p in pages] == [
        want[i : i + HASH_BYTES] for i in range(0, len(want), HASH_BYTES)
    ]
    assert {p.block_hash for p in pages}.isdisjoint(p.block_hash for p in plain_pages)
    assert states and all(s.block_hash == pages[s.boundary // cfg.block_size - 1].block_hash for s in states)
