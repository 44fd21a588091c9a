"""``dsi bench encoder``: images/s through the encoder role vs the same encoder in-process.

    role         EncoderActor in a child process (ActorServer on loopback TCP); the bench process
                 plays entrypoint and prefill: per image one EncodeImages (pixels as a zero-copy
                 frame), then PullEmbeds into a receive region of its own tcp data plane
    in-process   the same ImageBatcher the role runs (its worker thread and batching), in this
                 process: no control plane, no data plane

At batch 1 one image is in flight at a time; at batch 16, 16 requests of one image each are in
flight together (the batcher takes them as one batch, in the role and in-process alike). Every image is distinct (random pixels), so the role's embedding cache
never answers for the encoder. The role's embeddings of the first image are checked against
the in-process ones (same bits). Figures are medians over ``--repeats``; ratio = role / in-process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import secrets
import statistics
import time
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import torch
import uvloop
import zmq.asyncio

from dsi.bench.child import stop_process
from dsi.config import EncoderOptions, ModelConfig
from dsi.messages import ALL
from dsi.messages.blob import Blob
from dsi.messages.handoff import KvLease
from dsi.messages.vision import EncodeImages, ImagePixels, PullEmbeds
from dsi.model.prepare import ensure_model, ensure_vision
from dsi.model.vit import image_tensor, load_vision
from dsi.recipe.images import image_digest
from dsi.roles.encoder.batcher import ImageBatcher
from dsi.transport.client import Peer
from dsi.transport.kv import make_data_plane
from dsi.transport.server import ActorServer

SIDE = 224  # pixels per side of a bench image (64 embedding rows each in the tiny shape)


@dataclass(frozen=True, slots=True)
class EncoderFigures:
    batch: int
    role_images_per_s: float
    inprocess_images_per_s: float
    ratio: float


def _serve(conn: Connection, model_dir: str, max_batch: int) -> None:
    uvloop.run(_serve_async(conn, model_dir, max_batch))


async def _serve_async(conn: Connection, model_dir: str, max_batch: int) -> None:
    from dsi.roles.encoder.actor import EncoderActor, EncoderSettings

    settings = EncoderSettings(
        EncoderOptions(max_batch_images=max_batch),
        ModelConfig(name="dsi-tiny", dir=Path(model_dir), config="tiny"),
    )
    ctx = zmq.asyncio.Context()
    server = ActorServer(EncoderActor("encoder-bench", settings), "tcp://127.0.0.1:*", ctx, role="encoder")
    await server.start()
    conn.send(server.address)
    await asyncio.Event().wait()  # serves until the parent terminates this process


def _images(n: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8) for _ in range(n)]


async def _through_role(
    peer: Peer, data, images: list[np.ndarray], hidden: int, batch: int
) -> tuple[float, torch.Tensor]:
    """Seconds to push every image through the role, ``batch`` requests in flight; the first
    image's embeddings."""
    first: list[torch.Tensor] = []

    async def one(pixels: np.ndarray) -> torch.Tensor:
        digest = image_digest(SIDE, SIDE, pixels.tobytes())
        answer = await peer.ask(
            EncodeImages(secrets.token_hex(4), [ImagePixels(digest, SIDE, SIDE, Blob.of(pixels))])
        )
        rows = answer.tokens[0]
        inbound = data.expect(f"bench.{secrets.token_hex(6)}", rows * hidden * 4, 30.0)
        try:
            t = inbound.target
            await peer.ask(
                PullEmbeds(
                    [digest], KvLease(t.transfer_id, t.backend, t.address, t.nbytes, 0, 30.0, t.region)
                )
            )
            buf = await inbound.wait()
            return torch.frombuffer(bytearray(buf), dtype=torch.float32).view(rows, hidden)
        finally:
            inbound.release()

    start = time.perf_counter()
    for i in range(0, len(images), batch):
        out = await asyncio.gather(*(one(im) for im in images[i : i + batch]))
        if not first:
            first.append(out[0])
    return time.perf_counter() - start, first[0]


async def _in_process(
    batcher: ImageBatcher, images: list[np.ndarray], batch: int
) -> tuple[float, torch.Tensor]:
    """The same batcher the role runs (its worker thread, its batching), called directly."""
    start = time.perf_counter()
    first = None
    for i in range(0, len(images), batch):
        out = await asyncio.gather(*(batcher.encode([image_tensor(im)]) for im in images[i : i + batch]))
        first = out[0][0] if first is None else first
    return time.perf_counter() - start, first  # type: ignore[return-value]


async def _run(args: argparse.Namespace) -> list[EncoderFigures]:
    directory = ensure_model(Path(args.model_dir), "tiny")
    ensure_vision(directory, "tiny")
    cfg, w = load_vision(directory)
    mp = multiprocessing.get_context("spawn")
    here, there = mp.Pipe()
    child = mp.Process(target=_serve, args=(there, str(directory), max(args.batches)), daemon=True)
    child.start()
    ctx = zmq.asyncio.Context()
    data = make_data_plane("tcp", "127.0.0.1")
    await data.start()
    peer = None
    try:
        if not here.poll(120):
            raise RuntimeError("the encoder role did not start in 120 s")
        peer = Peer(here.recv(), ctx, types=ALL, peer_id="bench", role="bench", timeout=120.0)
        await peer.connect()
        rng = np.random.default_rng(0)
        batcher = ImageBatcher(cfg, w, max(args.batches))
        batcher.start()
        out = []
        for batch in args.batches:
            role_rates, local_rates = [], []
            n = batch * args.rounds
            warm = _images(batch, rng)
            await _through_role(peer, data, warm, cfg.lm_hidden, batch)  # warm-up, both sides
            await _in_process(batcher, warm, batch)
            for _ in range(args.repeats):
                images = _images(n, rng)
                role_s, role_first = await _through_role(peer, data, images, cfg.lm_hidden, batch)
                local_s, local_first = await _in_process(batcher, images, batch)
                if not torch.equal(role_first, local_first):
                    raise RuntimeError("the role's embeddings differ from the in-process encoder's")
                role_rates.append(n / role_s)
                local_rates.append(n / local_s)
            role, local = statistics.median(role_rates), statistics.median(local_rates)
            out.append(EncoderFigures(batch, round(role, 2), round(local, 2), round(role / local, 3)))
        await batcher.close()
        return out
    finally:
        if peer is not None:
            await peer.close()
        await data.close()
        ctx.destroy(linger=0)
        stop_process(child)


def main(args: argparse.Namespace) -> int:
    figures = uvloop.run(_run(args))
    if args.json:
        print(
            json.dumps({"image_side": SIDE, "repeats": args.repeats, "results": [asdict(f) for f in figures]})
        )
    else:
        print(
            f"{'batch':>5} {'role img/s':>11} {'in-process img/s':>17} {'ratio':>6}   ({SIDE}x{SIDE} images)"
        )
        for f in figures:
            print(
                f"{f.batch:>5} {f.role_images_per_s:>11.1f} {f.inprocess_images_per_s:>17.1f} {f.ratio:>6.2f}"
            )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("encoder", help="images/s through the encoder role vs the same encoder in-process")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16], help="images in flight")
    p.add_argument("--rounds", type=int, default=4, help="batches per measurement")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--model-dir", default="run/models/tiny", help="generated (tiny) when empty")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=main)
