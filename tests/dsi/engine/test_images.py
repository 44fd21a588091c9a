"""Image embeddings in the engine: they change the output, and any chunking, a preemption and an
export/import reproduce the same tokens; their digests change the page hashes."""

from __future__ import annotations

import torch

from dsi.engine.engine import Engine, EngineConfig
from dsi.engine.images import ImageEmbeds
from dsi.engine.params import SamplingParams
from tests.dsi.engine.conftest import random_prompts

GREEDY = SamplingParams(max_tokens=4, temperature=0.0)
SMALL = {"num_blocks": 16, "num_slots": 4, "max_running": 4}


def images(seed: int = 0) -> list[ImageEmbeds]:
    gen = torch.Generator().manual_seed(seed)
    return [
        ImageEmbeds(40, torch.randn(20, 256, generator=gen) * 0.05, bytes([seed]) * 16),
        ImageEmbeds(150, torch.randn(30, 256, generator=gen) * 0.05, bytes([seed + 1]) * 16),
    ]


def run(tiny, prompt, ims, **config) -> list[int]:
    cfg, w = tiny
    engine = Engine(cfg, w, EngineConfig(async_scheduling=False, **(SMALL | config)))
    engine.add_request("r", prompt, GREEDY, images=ims)
    out = next(o for o in engine.run_until_done() if o.finished).output
    engine.close()
    return out


def test_images_change_the_output_and_chunking_does_not(tiny):
    prompt = random_prompts([260], seed=3)[0]
    whole = run(tiny, prompt, images())
    assert whole != run(tiny, prompt, [])
    assert whole != run(tiny, prompt, images(seed=5))
    assert run(tiny, prompt, images(), max_batch_tokens=37) == whole  # chunks cut through both images


def test_preemption_and_export_import_keep_the_images(tiny):
    cfg, w = tiny
    prompt = random_prompts([260], seed=3)[0]
    expected = run(tiny, prompt, images())
    # Preemption: 5 pages for two requests that need 3 + 3; the one with more output (r) is
    # preempted and recomputes its prompt, images included.
    engine = Engine(
        cfg, w, EngineConfig(async_scheduling=False, num_blocks=6, num_slots=2, max_batch_tokens=300)
    )
    engine.add_request("r", prompt, GREEDY, images=images())
    engine.add_request("s", random_prompts([300], seed=4)[0], SamplingParams(max_tokens=2, temperature=0.0))
    outs = {o.request_id: o.output for o in engine.run_until_done() if o.finished}
    assert engine.scheduler.preemptions > 0
    assert outs["r"] == expected
    engine.close()
    # Prefill in one engine, export, import in another: the state carries the embeddings.
    prefill = Engine(cfg, w, EngineConfig(async_scheduling=False, **SMALL))
    prefill.add_request("r", prompt, GREEDY, prefill_only=True, images=images())
    prefill.run_until_done()
    state = prefill.export_request("r")
    assert state.images is not None and state.images.shape == (50, 256)
    assert [s[:2] for s in state.image_spans] == [(40, 20), (150, 30)]
    decode = Engine(cfg, w, EngineConfig(async_scheduling=False, **SMALL))
    decode.import_request(state)
    assert decode.requests["r"].block_extras == prefill_extras(cfg.block_size)
    assert next(o for o in decode.run_until_done() if o.finished).output == expected
    prefill.close()
    decode.close()


def prefill_extras(block_size: int) -> dict[int, bytes]:
    a, b = images()
    return {0: a.digest, 1: b.digest} if block_size == 128 else {}


def test_the_image_digest_joins_the_page_hashes(tiny):
    cfg, w = tiny
    prompt = random_prompts([300], seed=3)[0]
    hashes = []
    for ims in (images(), images(), images(seed=9), []):
        engine = Engine(cfg, w, EngineConfig(async_scheduling=False, **SMALL))
        engine.add_request(
            "r", prompt, SamplingParams(max_tokens=1, temperature=0.0), prefill_only=True, images=ims
        )
        engine.run_until_done()
        hashes.append(list(engine.requests["r"].block_hashes))
        engine.close()
    same, again, other, plain = hashes
    assert same == again and len(same) == 2
    assert other[0] != same[0] and other[1] != same[1] and plain[0] != same[0]
