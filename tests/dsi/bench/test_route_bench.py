"""``dsi bench route``'s pieces: the echo decode speaks the real stream messages, the echo HTTP
backend streams OpenAI chunks, and the bench runs end to end without peers. Speed is not
asserted (a benchmark prints figures; the machine may be shared)."""

from __future__ import annotations

import argparse
import json
import multiprocessing

import zmq.asyncio
from aiohttp.test_utils import TestClient, TestServer

from dsi.bench import cli as bench_cli
from dsi.bench.echo_engine import EchoDecodeActor
from dsi.bench.echo_http import EchoBackend
from dsi.bench.route import echo_pieces, format_table, register
from dsi.engine.params import SamplingParams
from dsi.messages import ALL
from dsi.messages.gateway import Generate
from dsi.tokenizer import decode_ids
from dsi.transport.client import Peer
from dsi.transport.server import ActorServer

IDS = [1000 + i for i in range(16)]


async def test_echo_decode_streams_its_ids_one_per_chunk_cut_to_max_tokens():
    ctx = zmq.asyncio.Context()
    actor = EchoDecodeActor("decode-echo", IDS)
    server = ActorServer(actor, "tcp://127.0.0.1:*", ctx, role="decode")
    await server.start()
    peer = Peer(server.address, ctx, types=ALL, timeout=10)
    try:
        await peer.connect()
        full = [c async for c in peer.stream(Generate("r1", [1, 2, 3], SamplingParams(max_tokens=64)))]
        cut = [c async for c in peer.stream(Generate("r2", [1, 2], SamplingParams(max_tokens=3)))]
    finally:
        await peer.close()
        await server.stop()
        ctx.term()
    assert [c.token_ids for c in full] == [[t] for t in IDS]
    assert [c.finish for c in full] == [""] * 15 + ["length"]
    assert {c.request_id for c in full} == {"r1"} and {c.prompt_tokens for c in full} == {3}
    assert [c.token_ids for c in cut] == [[t] for t in IDS[:3]] and cut[-1].finish == "length"
    assert actor.served == 2 and actor.streams == 0


async def test_echo_backend_streams_one_chat_chunk_per_piece_then_done():
    pieces = ["Hello", ", ", "wörld", " 🌧️", '"quoted"']
    client = TestClient(TestServer(EchoBackend("m", pieces).app(), host="127.0.0.1"))
    await client.start_server()
    try:
        resp = await client.post("/v1/chat/completions", json={"model": "m", "stream": True, "messages": []})
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        events = (await resp.text()).strip().split("\n\n")
        short = await client.post(
            "/v1/chat/completions", json={"model": "m", "max_tokens": 2, "messages": []}
        )
        body = await short.json()
        health = await client.get("/health")
    finally:
        await client.close()
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)
    chunks = [json.loads(e[len("data: ") :]) for e in events[:-1]]
    assert [c["choices"][0]["delta"]["content"] for c in chunks] == pieces
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 4 + ["length"]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
    assert (
        body["choices"][0]["message"]["content"] == "Hello, "
        and body["choices"][0]["finish_reason"] == "length"
    )
    assert health.status == 200


def test_echo_pieces_are_the_text_of_the_ids_in_as_many_pieces():
    pieces = echo_pieces(IDS)
    assert len(pieces) == len(IDS) and "".join(pieces).strip() == decode_ids(IDS).strip()


def test_route_without_peers_measures_the_gateway_and_reaps_its_processes(capsys):
    assert "dsi.bench.route" in bench_cli._BENCHES
    parser = argparse.ArgumentParser(prog="dsi bench")
    register(parser.add_subparsers(dest="bench", required=True))
    args = parser.parse_args(["route", "--json", "--requests", "24", "--concurrency", "4", "--repeats", "1",
                              "--workers", "1", "--peers", ""])  # fmt: skip
    assert args.func(args) == 0
    figures = json.loads(capsys.readouterr().out)
    for name in ("route_req_s", "route_p50_ms", "route_p99_ms"):
        assert figures[name] > 0, name
    assert figures["route_p99_ms"] >= figures["route_p50_ms"]
    assert figures["route_cpu_us_per_req"] >= 0
    assert not any(k.startswith(("vllm", "sglang", "route_vs")) for k in figures)
    assert (figures["requests"], figures["concurrency"], figures["workers"]) == (24, 4, 1)
    assert multiprocessing.active_children() == []  # the cluster's processes were terminated
    assert "route" in format_table(figures)
