"""Layer-wise loading of prefix-hit pages: the same bits as copying them before the forward, and
no layer reads a part of a page before its copy finished."""

import threading
import time

import pytest
import torch

from dsi.engine import CachedPrefix, Engine, EngineConfig
from dsi.engine.hit_load import HitLoader, PagePart, copy_part, page_parts, page_runs
from dsi.engine.params import SamplingParams
from dsi.engine.prefix import ring_snapshot_shape
from dsi.kvcache.layout import page_elems
from dsi.model.config import TINY
from tests.dsi.engine.conftest import random_prompts

NEW = 4
PARAMS = SamplingParams(max_tokens=NEW, temperature=0, ignore_eos=True, top_logprobs=3)


def _pages(n: int, seed: int) -> torch.Tensor:
    """Stored pages: any fp32 values do (both paths must copy the same bytes)."""
    return 0.5 * torch.randn(n, page_elems(TINY), generator=torch.Generator().manual_seed(seed))


def _rings(seed: int) -> torch.Tensor:
    return 0.5 * torch.randn(ring_snapshot_shape(TINY), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def hits():
    """(prompt, CachedPrefix): bounded replays (R = H - 128; R = consumer_start), an exact hit."""
    p = random_prompts([300, 700, 420], seed=61)
    return [
        (p[0], CachedPrefix(256, _pages(2, 1))),
        (p[1], CachedPrefix(640, _pages(5, 2))),
        (p[2], CachedPrefix(256, _pages(2, 3), _rings(4))),
    ]


def _run(tiny, hits, layered, extra=(), **config):
    cfg, w = tiny
    engine = Engine(cfg, w, EngineConfig(layered_hit_load=layered, **config))
    for i, (prompt, cached) in enumerate(hits):
        engine.add_request(str(i), prompt, PARAMS, cached=cached)
    for i, prompt in enumerate(extra):
        engine.add_request(f"x{i}", prompt, PARAMS)
    assert (engine.hit_loader is not None) == layered
    outs = engine.run_until_done()
    done = {o.request_id: (o.output, o.logprobs) for o in outs if o.finished}
    tops: dict[str, list] = {}
    for o in outs:
        tops.setdefault(o.request_id, []).extend(o.new_top_logprobs)
    pool, slots = engine.runner.pool, engine.runner.slots
    assert pool.num_free == pool.num_blocks - 1 and slots.num_free == slots.num_slots
    engine.close()
    return {k: (*v, tops[k]) for k, v in done.items()}, engine


# ---- the page parts and the copier ---------------------------------------------------------------
def test_tiny_page_parts_follow_the_layers_that_read_them():
    # sources at layers 1 and 3 (64 latents x 64 each), the global latents at the boundary (layer 4)
    assert page_parts(TINY) == (PagePart(1, 0, 4096), PagePart(3, 4096, 8192), PagePart(4, 8192, 16384))


def test_page_runs_group_consecutive_pool_pages():
    assert page_runs([5, 6, 7, 2, 3, 9]) == [(5, 0, 3), (2, 3, 2), (9, 5, 1)]
    assert page_runs([]) == []


def test_loader_copies_every_byte_into_scattered_pages():
    pool = torch.zeros(16, page_elems(TINY))
    src = _pages(5, 7)
    blocks = [9, 3, 4, 5, 12]
    loader = HitLoader(TINY, torch.device("cpu"))
    load = loader.start(pool, blocks, src)
    load.wait_all()
    loader.close()
    assert load.done and load.error is None
    assert torch.equal(pool[blocks], src)
    untouched = [b for b in range(16) if b not in blocks]
    assert not pool[untouched].any()


def _slow(delay_s: float, log: list, lock: threading.Lock):
    """A copier that waits before each part and logs ("copied", first layer) once it is done."""
    layer_of = {p.start: p.layer for p in page_parts(TINY)}

    def copy(dst, src, runs, start, stop):
        time.sleep(delay_s)
        copy_part(dst, src, runs, start, stop)
        with lock:
            log.append(("copied", layer_of[start]))

    return copy


def test_cancel_stops_between_parts_and_returns_when_the_copier_is_off():
    pool = torch.zeros(8, page_elems(TINY))
    log: list = []
    loader = HitLoader(TINY, torch.device("cpu"), copy=_slow(0.2, log, threading.Lock()))
    load = loader.start(pool, [1, 2], _pages(2, 8))
    time.sleep(0.05)  # the copier is inside the first part
    load.cancel()
    assert load.done and log == [("copied", 1)]
    time.sleep(0.3)
    assert log == [("copied", 1)] and not pool[:, 4096:].any()  # nothing copied after the cancel
    loader.close()


def test_a_failed_copy_fails_the_wait():
    def broken(dst, src, runs, start, stop):
        raise OSError("the source went away")

    loader = HitLoader(TINY, torch.device("cpu"), copy=broken)
    load = loader.start(torch.zeros(4, page_elems(TINY)), [1], _pages(1, 9))
    with pytest.raises(RuntimeError, match="prefix hit failed") as err:
        load.wait(1)
    assert isinstance(err.value.__cause__, OSError)
    load.wait(0)  # layer 0 reads no part: nothing to fail
    loader.close()


def test_the_earliest_layer_is_served_first_across_loads():
    pool = torch.zeros(8, page_elems(TINY))
    order: list = []
    gate = threading.Event()

    def copy(dst, src, runs, start, stop):
        gate.wait()
        order.append((runs[0][0], start))
        copy_part(dst, src, runs, start, stop)

    loader = HitLoader(TINY, torch.device("cpu"), copy=copy)
    a = loader.start(pool, [1], _pages(1, 10))
    b = loader.start(pool, [2], _pages(1, 11))
    gate.set()
    a.wait_all()
    b.wait_all()
    loader.close()
    # a's first part may already be under way; after that, layer order, a before b at equal layers
    assert order[1:] == [(2, 0), (1, 4096), (2, 4096), (1, 8192), (2, 8192)]


# ---- the engine: the same bits as a copy before the forward -------------------------------------------
@pytest.fixture(scope="module")
def serial(tiny, hits):
    outs, _ = _run(tiny, hits, layered=False, extra=random_prompts([90], seed=62))
    return outs


@pytest.mark.parametrize(
    "config",
    [
        {"async_scheduling": False},
        {"async_scheduling": True},
        {"async_scheduling": False, "max_batch_tokens": 97},
        {"async_scheduling": True, "max_batch_tokens": 97},
    ],
    ids=["sync", "async", "sync-chunk97", "async-chunk97"],
)
def test_layered_load_gives_the_bits_of_the_serial_load(tiny, hits, serial, config):
    outs, _ = _run(tiny, hits, layered=True, extra=random_prompts([90], seed=62), **config)
    assert outs == serial  # tokens, logprobs and top logprobs, float for float


def test_preempted_hits_are_loaded_again_with_the_same_bits(tiny):
    # 3 + 2 + 4 pages fill the pool's 9; each needs one more a few tokens in: preemptions
    p = random_prompts([380, 250, 510], seed=63)
    hits = [
        (p[0], CachedPrefix(256, _pages(2, 12))),
        (p[1], CachedPrefix(128, _pages(1, 13))),
        (p[2], CachedPrefix(256, _pages(2, 14), _rings(15))),
    ]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    got = {}
    for layered in (False, True):
        cfg, w = tiny
        engine = Engine(cfg, w, EngineConfig(layered_hit_load=layered, num_blocks=10, max_batch_tokens=256))
        starts: list[list[int]] = []
        if layered:
            start = engine.hit_loader.start

            def counted(dst, blocks, src, start=start, starts=starts):
                starts.append(blocks)
                return start(dst, blocks, src)

            engine.hit_loader.start = counted
        for i, (prompt, cached) in enumerate(hits):
            engine.add_request(str(i), prompt, params, cached=cached)
        got[layered] = {o.request_id: (o.output, o.logprobs) for o in engine.run_until_done() if o.finished}
        assert engine.scheduler.preemptions > 0
        if layered:
            assert len(starts) > len(hits)  # a preempted hit was admitted, and loaded, again
        assert engine.runner.pool.num_free == engine.runner.pool.num_blocks - 1
        engine.close()
    assert got[True] == got[False] and len(got[True]) == len(hits)


def test_an_exported_prefilled_hit_is_the_same_state(tiny, hits):
    states = {}
    for layered in (False, True):
        cfg, w = tiny
        engine = Engine(cfg, w, EngineConfig(layered_hit_load=layered))
        for i, (prompt, cached) in enumerate(hits):
            engine.add_request(str(i), prompt, PARAMS, prefill_only=True, cached=cached)
        engine.run_until_done()
        states[layered] = [engine.export_request(str(i)) for i in range(len(hits))]
        engine.close()
    for a, b in zip(states[False], states[True], strict=True):
        assert torch.equal(a.pages, b.pages) and torch.equal(a.rings, b.rings)
        assert torch.equal(a.partial, b.partial) and a.output == b.output


# ---- no layer reads a part before its copy ------------------------------------------------------------
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_no_layer_starts_before_the_parts_it_reads_are_copied(tiny, hits, serial, async_scheduling):
    cfg, w = tiny
    prompt, cached = hits[1]
    engine = Engine(cfg, w, EngineConfig(async_scheduling=async_scheduling))
    log: list = []
    lock = threading.Lock()
    engine.hit_loader.copy = _slow(0.15, log, lock)
    layer = engine.runner._layer

    def logged_layer(i, *args, **kwargs):
        with lock:
            log.append(("layer", i))
        return layer(i, *args, **kwargs)

    engine.runner._layer = logged_layer
    engine.add_request("1", prompt, PARAMS, cached=cached)
    outs = engine.run_until_done()
    engine.close()
    first = log[: log.index(("layer", cfg.n_layers - 1)) + 1]  # the hit's first forward
    copied: set[int] = set()
    for kind, n in first:
        if kind == "copied":
            copied.add(n)
        else:  # every part this layer (or an earlier one) reads is in place
            assert {p.layer for p in page_parts(cfg) if p.layer <= n} <= copied, first
    assert first[0] == ("layer", 0)  # the forward started before the first part was copied
    assert copied == {1, 3, 4}
    finished = next(o for o in outs if o.finished)
    assert (finished.output, finished.logprobs) == serial["1"][:2]


def test_an_aborted_hit_stops_its_load_before_its_pages_are_freed(tiny, hits):
    cfg, w = tiny
    prompt, cached = hits[1]
    engine = Engine(cfg, w, EngineConfig(async_scheduling=False))
    log: list = []
    engine.hit_loader.copy = _slow(0.2, log, threading.Lock())
    engine.add_request("1", prompt, PARAMS, cached=cached)
    step = engine.scheduler.schedule()  # admitted: its load starts; the step is never run
    load = step.slices[0].hit_load
    assert load is not None and not load.done
    engine.abort("1")
    assert load.done and len(log) < len(page_parts(cfg))  # stopped between parts
    assert engine.runner.pool.num_free == engine.runner.pool.num_blocks - 1
    engine.close()
