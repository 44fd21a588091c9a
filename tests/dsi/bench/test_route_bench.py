"""``dsi bench route``'s pieces: the echo decode speaks the real stream messages, the echo HTTP
backend streams OpenAI chunks, and the bench runs end to end without peers, its ``route``
requests routed by the balancer process. Speed is not asserted (a benchmark prints figures; the
machine may be shared)."""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing

import zmq.asyncio
from aiohttp.test_utils import TestClient, TestServer

from dsi.actor import handles
from dsi.bench import cli as bench_cli
from dsi.bench.echo_engine import EchoDecodeActor
from dsi.bench.echo_http import EchoBackend
from dsi.bench.route import echo_pieces, format_table, register
from dsi.engine.params import SamplingParams
from dsi.messages import ALL
from dsi.messages.balancer import LoadReport
from dsi.messages.gateway import Generate
from dsi.roles.role import RoleActor
from dsi.tokenizer import decode_ids
from dsi.transport.client import Peer
from dsi.transport.server import ActorServer

IDS = [1000 + i for i in range(16)]


class RecordingBalancer(RoleActor):
    """Keeps every LoadReport it is told."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.reports: list[LoadReport] = []

    @handles
    def load_report(self, msg: LoadReport) -> None:
        self.reports.append(msg)


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


async def test_echo_decode_reports_its_load_to_a_balancer_with_capacity_and_accepted():
    ctx = zmq.asyncio.Context()
    balancer = RecordingBalancer("balancer-0")
    server = ActorServer(balancer, "tcp://127.0.0.1:*", ctx, role="balancer")
    await server.start()
    actor = EchoDecodeActor("decode-echo", IDS, [server.address])
    echo = ActorServer(actor, "tcp://127.0.0.1:*", ctx, role="decode")
    await echo.start()
    peer = Peer(echo.address, ctx, types=ALL, timeout=10)
    try:
        await peer.connect()
        [c async for c in peer.stream(Generate("r1", [1, 2, 3], SamplingParams(max_tokens=4)))]
        for _ in range(200):  # the reporter sends within ~5 ms of the stream's end, once connected
            if balancer.reports and balancer.reports[-1].accepted == 1 and balancer.reports[-1].running == 0:
                break
            await asyncio.sleep(0.02)
    finally:
        await peer.close()
        await echo.stop()
        await server.stop()
        ctx.term()
    last = balancer.reports[-1]
    assert (last.instance_id, last.role, last.accepted, last.running) == ("decode-echo", "decode", 1, 0)
    assert last.max_requests > 0 and last.kv_capacity_tokens > 0  # else the balancer cannot score it
    assert balancer.reports[0].started_at == last.started_at


def test_route_without_peers_measures_the_gateway_and_reaps_its_processes(capsys):
    assert "dsi.bench.route" in bench_cli._BENCHES
    parser = argparse.ArgumentParser(prog="dsi bench")
    register(parser.add_subparsers(dest="bench", required=True))
    args = parser.parse_args(["route", "--json", "--requests", "24", "--concurrency", "4", "--repeats", "1",
                              "--workers", "1", "--peers", "", "--no-ask"])  # fmt: skip
    assert args.func(args) == 0
    figures = json.loads(capsys.readouterr().out)
    for system in ("route", "route_local"):
        for name in ("req_s", "p50_ms", "p99_ms"):
            assert figures[f"{system}_{name}"] > 0, (system, name)
        assert figures[f"{system}_p99_ms"] >= figures[f"{system}_p50_ms"]
        assert figures[f"{system}_cpu_us_per_req"] >= 0
    assert figures["route_balancer_cpu_us_per_req"] > 0  # the balancer process did the routing
    # From the balanced gateway's /metrics: every decode route of the measured rounds came from
    # the balancer (the bench waits up to 1 s for one; a balancer that did not know the echoes
    # would answer no_instance and the gateway would pick locally).
    assert figures["balancer_timeout_ms"] == 1000.0
    assert figures["route_balancer_fraction"] == 1.0 and figures["route_fallbacks"] == {}, figures
    assert figures["route_table_fraction"] > 0 and "route_query_req_s" not in figures
    assert figures["route_vs_route_local"] > 0
    assert not any(k.startswith(("vllm", "sglang", "route_vs_vllm", "route_vs_sglang")) for k in figures)
    assert (figures["requests"], figures["concurrency"], figures["workers"]) == (24, 4, 1)
    assert multiprocessing.active_children() == []  # the cluster's processes were terminated
    table = format_table(figures)
    assert "route_local" in table and "of its routes from the balancer" in table
