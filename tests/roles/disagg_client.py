"""Run greedy requests through a cluster's router from wherever this process runs (for example
inside a network namespace): ``python -m tests.roles.disagg_client CONTROLLER PROMPTS.json N``
prints the outputs as one JSON list."""

from __future__ import annotations

import asyncio
import json
import sys

import zmq.asyncio

from dsi.engine.params import SamplingParams
from dsi.messages.gateway import Generate
from dsi.roles.entrypoint.backends import DecodePool


async def run(controller: str, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    ctx = zmq.asyncio.Context()
    pool = DecodePool(controller, ctx, refresh_s=0.3)
    await pool.start()
    try:
        for _ in range(300):
            await pool.refresh()
            if pool.decode.ready and pool.prefill.ready:
                break
            await asyncio.sleep(0.1)

        async def one(i: int, prompt: list[int]) -> list[int]:
            msg = Generate(f"n{i}", prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0))
            return [t async for chunk in pool.generate(msg) for t in chunk.token_ids]

        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    finally:
        await pool.close()
        ctx.destroy(linger=0)


if __name__ == "__main__":
    with open(sys.argv[2]) as f:
        prompts = json.load(f)
    print(json.dumps(asyncio.run(run(sys.argv[1], prompts, int(sys.argv[3])))))
