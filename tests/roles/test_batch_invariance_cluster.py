"""Batch invariance end to end: 64 chat prompts of 10-2,000 tokens give the same greedy tokens
all together in one engine (16 of them, spread over the lengths, also alone) and as 64
concurrent HTTP streams through the disaggregated local cluster (the `dsi serve` layout, cold
store)."""

from __future__ import annotations

import asyncio
import json
import random
import re

import aiohttp
import pytest

from dsi.engine.engine import Engine, EngineConfig
from dsi.engine.params import EOS_ID, SamplingParams
from dsi.model.config import get_config
from dsi.model.prepare import ensure_model
from dsi.model.weights import load_model
from dsi.recipe import ModelVersion, Recipe
from dsi.recipe.emit_stream import OutputStream
from dsi.roles.entrypoint.prepare import Preparer
from tests.dsi.cli.procs import SHARED_MODEL_DIR
from tests.roles.cluster import Cluster, cluster_config, reference_outputs
from tests.roles.test_disaggregation_http import WORDS, deltas

pytestmark = pytest.mark.slow
MAX_TOKENS = 8


def chat_bodies(n: int, seed: int) -> list[dict]:
    """Chat requests whose prompts spread over 10 .. 2,000 tokens."""
    rng = random.Random(seed)
    words = [5 + int(1_680 * (i / (n - 1)) ** 1.5) for i in range(n)]  # about 1.15 tokens per word
    rng.shuffle(words)
    return [
        {
            "model": "dsi-tiny",
            "stream": True,
            "temperature": 0,
            "max_tokens": MAX_TOKENS,
            "thinking": {"type": "disabled"},
            "messages": [{"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(k))}],
        }
        for k in words
    ]


def alone_outputs(prompts: list[list[int]]) -> list[list[int]]:
    """Each prompt run by itself (one engine, one request at a time)."""
    cfg, w = load_model(ensure_model(SHARED_MODEL_DIR, "tiny"))
    engine = Engine(cfg, w, EngineConfig())
    outs = []
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0))
        outs += [o.output for o in engine.run_until_done() if o.finished]
    engine.close()
    return outs


def stream_of(prep, ids: list[int]) -> tuple[str, str, list[str]]:
    out = OutputStream(prep.options)
    pieces = out.feed(ids)
    pieces += out.finish("length" if len(ids) == MAX_TOKENS and ids[-1] != EOS_ID else "stop")
    return deltas("".join(pieces))


async def test_64_prompts_alone_together_and_through_the_cluster(procs, tmp_path):
    requests = chat_bodies(64, seed=23)
    preparer = Preparer(Recipe({"dsi-tiny": ModelVersion.V4}), get_config("tiny").max_context)
    prepared = [preparer("chat", json.dumps(body).encode(), "chatbot") for body in requests]
    lengths = sorted(len(p.token_ids) for p in prepared)
    assert 10 <= lengths[0] <= 20 and 1_700 <= lengths[-1] <= 2_000, lengths
    together = reference_outputs([p.token_ids for p in prepared], max_tokens=MAX_TOKENS)
    # Alone: every 4th prompt by length (16 of 10-2,000 tokens); tests/dsi/engine/test_invariant.py
    # checks alone against together for every request of its batches.
    picked = sorted(range(len(prepared)), key=lambda i: len(prepared[i].token_ids))[::4]
    assert alone_outputs([prepared[i].token_ids for i in picked]) == [together[i] for i in picked]

    config = cluster_config(
        tmp_path,
        keep=("controller-0", "entrypoint-0", "kvstore-0", "prefill-0", "prefill-1", "decode-0", "decode-1"),
    )
    Cluster(config, procs).start()
    http = re.search(r'http = "([^"]+)"', config.read_text()).group(1)  # type: ignore[union-attr]
    async with aiohttp.ClientSession() as session:
        for _ in range(150):  # the gateway learns the instances by heartbeat
            async with session.get(f"http://{http}/health") as resp:
                health = await resp.json()
            if health.get("instances") == 2 and health.get("prefill_instances") == 2:
                break
            await asyncio.sleep(0.2)

        async def one(body: dict) -> str:
            async with session.post(f"http://{http}/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                return await resp.text()

        got = await asyncio.gather(*(one(body) for body in requests))
    assert [deltas(sse) for sse in got] == [
        stream_of(p, ids) for p, ids in zip(prepared, together, strict=True)
    ]
