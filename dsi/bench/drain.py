"""``dsi bench drain``: moving a draining decode's requests, live migration beside recompute.

    dsi bench drain [--requests 32] [--min-context 1024] [--max-context 8192] [--grace 1.0]
                    [--max-tokens 64] [--seed 0] [--json]

Two engines of the tiny model (a draining one, A, and a target, B) joined by the tcp data plane
on 127.0.0.1, driven through their ``EngineService`` as the decode roles drive them. A starts
with ``--requests`` running requests of a context drawn uniformly from [min, max] tokens (their
KV is synthetic: imported, not prefilled, since only the move is measured; their tokens are
noise). Then, side by side in one run:

- migrate: during ``--grace`` seconds the full pages are pre-copied to B every 0.2 s while the
  requests decode on A; at its end one batch exports every request from A without the pages B
  holds, sends the tails (the pages written since, SWA rings, compressor state) and imports
  them on B. ``migrate_s``: end of the grace period -> the last request's first token on B.
- recompute: the same requests re-prefilled on B from their prompt and the tokens so far (what
  a re-run does). ``recompute_s``: start -> the last request's first token.

Figures: ``migrate_s``, ``recompute_s``, ``migrate_vs_recompute`` (their ratio; target <= 0.5);
``stall_ms_p50`` / ``stall_ms_p99``: per request, its last token on A -> its first on B;
``tbt_ms_p99``: the gap between tokens on A during the grace period (target: stall_ms_p99 <=
2 x tbt_ms_p99); ``precopied_mib`` / ``tail_mib``: bytes moved before and at the switch.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from dsi.engine import EngineService, EngineShape, RequestState
from dsi.engine.engine import Engine, EngineConfig
from dsi.engine.params import SamplingParams
from dsi.model.config import TINY, ModelConfig
from dsi.model.reference import consumer_start
from dsi.model.weights import init_weights
from dsi.transport.kv import make_data_plane

_PRECOPY_INTERVAL_S = 0.2


@dataclass(slots=True)
class _Running:
    """One request decoding on A: the perf_counter time of each token it produced."""

    request_id: str
    prompt: list[int]
    stamps: list[float] = field(default_factory=list)
    held: int = 0  # pages B holds
    moved_at: float = 0.0  # its first token on B


def _synthetic(
    cfg: ModelConfig, request_id: str, context: int, rng: random.Random, params: SamplingParams
) -> RequestState:
    """A request that has computed ``context`` positions (random KV), with one token to feed next."""
    n = -(-context // cfg.block_size)
    layout = EngineShape.of(cfg, num_blocks=2, num_slots=1).state_layout(n)
    pages, rings, partial = (torch.randn(b.shape) * 0.1 for b in layout.buffers)
    prompt = [rng.randrange(3, 20_000) for _ in range(context - 1)]
    return RequestState(
        request_id,
        prompt,
        [rng.randrange(3, 20_000)],
        params,
        rng.getrandbits(31),
        consumer_start(len(prompt), cfg.keep),
        context - 1,
        pages,
        rings,
        partial,
        [0.0],
    )


async def _pump(service: EngineService, stream, run: _Running, on_b: bool) -> None:
    with contextlib.suppress(Exception):  # RequestMoved ends A's streams
        async for out in stream:
            if out.new_tokens:
                now = time.perf_counter()
                if on_b:
                    run.moved_at = run.moved_at or now
                else:
                    run.stamps.append(now)


async def _run(requests: int, lo: int, hi: int, grace_s: float, max_tokens: int, seed: int) -> dict:
    cfg, weights = TINY, init_weights(TINY)
    rng = random.Random(seed)
    contexts = [rng.randint(lo, hi) for _ in range(requests)]
    pages = sum(-(-(c + max_tokens) // cfg.block_size) for c in contexts) + 8
    econf = EngineConfig(
        num_blocks=pages,
        num_slots=requests,
        max_running=requests,
        max_batch_tokens=2048,
        async_scheduling=False,
    )
    a = EngineService(Engine(cfg, weights, econf))
    b = EngineService(Engine(cfg, weights, econf))
    plane_a, plane_b = make_data_plane("tcp"), make_data_plane("tcp")
    tasks: list[asyncio.Task] = []
    for x in (a, b):
        x.start()
    for p in (plane_a, plane_b):
        await p.start()
    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        runs: dict[str, _Running] = {}
        for i, ctx in enumerate(contexts):
            state = _synthetic(cfg, f"r{i}", ctx, rng, params)
            runs[state.request_id] = run = _Running(state.request_id, state.prompt + state.output)
            tasks.append(asyncio.create_task(_pump(a, a.import_request(state), run, on_b=False)))
        while any(not r.stamps for r in runs.values()):
            await asyncio.sleep(0.01)
        reservations = {rid: await b.reserve(0) for rid in runs}
        precopied = tail = 0
        deadline = time.perf_counter() + grace_s
        while time.perf_counter() < deadline:  # Step 1: pre-copy full pages while A decodes
            copies = await asyncio.gather(*(a.full_pages_of(rid, r.held) for rid, r in runs.items()))
            for (rid, run), full in zip(runs.items(), copies, strict=True):
                if full.shape[0]:
                    precopied += await _send(plane_a, plane_b, b, reservations[rid], run.held, full)
                    run.held += full.shape[0]
            await asyncio.sleep(max(0.0, min(_PRECOPY_INTERVAL_S, deadline - time.perf_counter())))
        t_switch = time.perf_counter()  # Step 2: the switch, in one batch
        states = await a.export_batch({rid: r.held for rid, r in runs.items()})
        moved = []
        for rid, state in states.items():
            if not isinstance(state, RequestState):  # e.g. it finished during the grace period
                raise RuntimeError(
                    f"{rid} could not be moved ({state}); with --max-tokens {max_tokens} it may "
                    f"have finished within the {grace_s:g}s grace period: raise --max-tokens"
                )
            run, res = runs[rid], reservations[rid]
            await b.grow_reservation(res, run.held + state.pages.shape[0])
            moved.append((rid, state, res))
        inbounds = [plane_b.expect(f"tail.{rid}", s.nbytes, 30.0) for rid, s, _ in moved]
        await asyncio.gather(
            *(
                plane_a.send(ib.target, s.to_parts(), 30.0)
                for ib, (_, s, _) in zip(inbounds, moved, strict=True)
            )
        )
        for ib, (rid, s, res) in zip(inbounds, moved, strict=True):
            buf = await ib.wait()
            got = RequestState.from_buffer(
                s.layout(),
                buf,
                rid,
                s.prompt,
                s.output,
                s.params,
                s.seed,
                s.consumer_start,
                s.num_computed,
                s.logprobs,
            )
            tasks.append(
                asyncio.create_task(
                    _pump(b, b.import_request(got, res, runs[rid].held), runs[rid], on_b=True)
                )
            )
            ib.release()
            tail += s.nbytes
        while any(not r.moved_at for r in runs.values()):
            await asyncio.sleep(0.001)
        migrate_s = max(r.moved_at for r in runs.values()) - t_switch
        stalls = [1e3 * (r.moved_at - r.stamps[-1]) for r in runs.values()]
        gaps = [1e3 * g for r in runs.values() for g in np.diff([s for s in r.stamps if s < t_switch])]
        for rid in runs:  # Step 3: recompute the same requests on an idle B
            b.abort(rid)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        t0 = time.perf_counter()
        firsts = await asyncio.gather(
            *(
                _first(b, f"re{i}", r.prompt + states[rid].output[1:], params)
                for i, (rid, r) in enumerate(runs.items())
            )
        )
        recompute_s = max(firsts) - t0
        return {
            "requests": requests,
            "context_min": lo,
            "context_max": hi,
            "grace_s": grace_s,
            "migrate_s": round(migrate_s, 4),
            "recompute_s": round(recompute_s, 4),
            "migrate_vs_recompute": round(migrate_s / recompute_s, 4),
            "stall_ms_p50": round(float(np.percentile(stalls, 50)), 2),
            "stall_ms_p99": round(float(np.percentile(stalls, 99)), 2),
            "tbt_ms_p99": round(float(np.percentile(gaps, 99)), 2) if gaps else None,
            "precopied_mib": round(precopied / 2**20, 2),
            "tail_mib": round(tail / 2**20, 2),
        }
    finally:  # an error mid-way must not leave engine threads or listening planes behind
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for x in (a, b):
            await x.close()
        for p in (plane_a, plane_b):
            await p.close()


async def _send(src, dst, engine: EngineService, res, start: int, pages: torch.Tensor) -> int:
    """Pre-copy ``pages`` into ``res`` from page ``start`` over the data plane; bytes sent."""
    await engine.grow_reservation(res, start + pages.shape[0])
    nbytes = pages.numel() * 4
    inbound = dst.expect(f"pages.{id(res)}.{start}", nbytes, 30.0)
    await src.send(inbound.target, [pages.numpy()], 30.0)
    buf = await inbound.wait()
    engine.write_pages(res, start, torch.frombuffer(buf, dtype=torch.float32).view(pages.shape))
    inbound.release()
    return nbytes


async def _first(service: EngineService, request_id: str, prompt: list[int], params: SamplingParams) -> float:
    stream = service.generate(request_id, prompt, params)
    async with contextlib.aclosing(stream):
        await anext(stream)
    return time.perf_counter()


def run(
    requests: int = 32,
    min_context: int = 1024,
    max_context: int = 8192,
    grace_s: float = 1.0,
    max_tokens: int = 64,
    seed: int = 0,
) -> dict:
    return asyncio.run(_run(requests, min_context, max_context, grace_s, max_tokens, seed))


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("drain", help="drain a decode: live KV migration beside recompute")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--min-context", type=int, default=1024, help="tokens")
    parser.add_argument("--max-context", type=int, default=8192, help="tokens")
    parser.add_argument("--grace", type=float, default=1.0, help="seconds of pre-copy before the switch")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    figures = run(args.requests, args.min_context, args.max_context, args.grace, args.max_tokens, args.seed)
    print(json.dumps(figures) if args.json else "\n".join(f"{k:22} {v}" for k, v in figures.items()))
    return 0
