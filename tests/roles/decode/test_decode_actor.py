import asyncio

import msgspec
import pytest
import zmq.asyncio

from dsi.config import EngineOptions, ModelConfig
from dsi.engine.engine import Engine
from dsi.engine.hit_policy import NO_HIT, HitChoice
from dsi.engine.params import SamplingParams
from dsi.errors import InvalidRequest, PeerLost
from dsi.messages import ALL
from dsi.messages.control import Load
from dsi.messages.gateway import Generate
from dsi.messages.handoff import GetEngineStats, Handoff, HitUnavailable
from dsi.model.prepare import ensure_model
from dsi.model.weights import load_model
from dsi.roles.decode import DecodeActor
from dsi.roles.engine_role import EngineRoleSettings
from dsi.transport.client import Peer
from dsi.transport.server import ActorServer
from tests.dsi.cli.procs import SHARED_MODEL_DIR


@pytest.fixture(scope="module")
def model_dir():
    return ensure_model(SHARED_MODEL_DIR, "tiny")


@pytest.fixture
async def decode(model_dir):
    ctx = zmq.asyncio.Context()
    settings = EngineRoleSettings(
        EngineOptions(max_batch_tokens=512, max_running=8),
        ModelConfig(name="dsi-tiny", dir=model_dir, config="tiny"),
    )
    actor = DecodeActor("decode-t", settings)
    server = ActorServer(actor, "tcp://127.0.0.1:*", ctx, role="decode")
    await server.start()
    peer = Peer(server.address, ctx, types=ALL, timeout=30)
    await peer.connect()
    yield actor, peer
    await peer.close()
    await server.stop()
    ctx.term()


async def test_generate_streams_the_offline_engine_tokens(decode, model_dir):
    _, peer = decode
    prompt = [0, 100, 200, 300, 400]
    chunks = [
        c async for c in peer.stream(Generate("r1", prompt, SamplingParams(max_tokens=6, temperature=0)))
    ]
    assert chunks[-1].finish == "length" and all(c.finish == "" for c in chunks[:-1])
    cfg, w = load_model(model_dir)
    engine = Engine(cfg, w)
    engine.add_request("x", prompt, SamplingParams(max_tokens=6, temperature=0))
    expected = next(o for o in engine.run_until_done() if o.finished).output
    engine.close()
    assert [t for c in chunks for t in c.token_ids] == expected


async def test_bad_request_is_a_typed_error(decode):
    _, peer = decode
    with pytest.raises(InvalidRequest, match="empty"):
        [c async for c in peer.stream(Generate("bad", [], SamplingParams()))]


async def test_cancelled_stream_aborts_in_the_engine(decode):
    _, peer = decode
    stream = peer.stream(
        Generate("long", list(range(1000, 1300)), SamplingParams(max_tokens=400, temperature=0))
    )
    await stream.__anext__()
    load = await peer.ask(Load())
    assert load.running == 1 and load.kv_tokens > 0
    await stream.aclose()  # sends CANCEL: the server cancels the handler, the engine aborts

    async def settled():
        mem = await peer.ask(GetEngineStats())
        return (await peer.ask(Load())).running == 0 and mem.free_blocks == mem.total_blocks > 0

    for _ in range(300):  # pages of a request in the step in flight are freed once that step ends
        if await settled():
            break
        await asyncio.sleep(0.02)
    assert await settled()


async def test_a_colocated_run_reports_no_hit_and_refuses_a_pinned_bounded_hit(decode):
    _, peer = decode
    prompt = list(range(100, 400))
    chunks = [
        c async for c in peer.stream(Generate("h1", prompt, SamplingParams(max_tokens=3, temperature=0)))
    ]
    assert chunks[0].hit == NO_HIT and all(c.hit is None for c in chunks[1:])
    for pin in (NO_HIT, HitChoice(128, exact=True)):  # the hit-free output, which a colocated run has
        msg = Generate("h2", prompt, SamplingParams(max_tokens=3, temperature=0), pin_hit=pin)
        assert [t for c in chunks for t in c.token_ids] == [
            t async for c in peer.stream(msg) for t in c.token_ids
        ]
    with pytest.raises(HitUnavailable, match="bounded-replay hit of 256"):
        [
            c
            async for c in peer.stream(
                Generate("h3", prompt, SamplingParams(max_tokens=3), pin_hit=HitChoice(256))
            )
        ]


async def test_a_request_meant_for_another_run_of_the_instance_is_refused_and_runs_nothing(decode):
    """dsi.roles.run_fence: a request that waited in a socket queue while the run it was sent to
    died must not run in the run that replaced it."""
    actor, peer = decode
    stale = Generate(
        "stale",
        [0, 100, 200],
        SamplingParams(max_tokens=4, temperature=0),
        instance_run=actor.started_at - 60,
    )
    with pytest.raises(PeerLost, match="which is gone"):
        [c async for c in peer.stream(stale)]
    with pytest.raises(PeerLost, match="which is gone"):
        [c async for c in peer.stream(Handoff(stale, "tcp://127.0.0.1:9", "prefill-0"))]
    mem = await peer.ask(GetEngineStats())
    assert (await peer.ask(Load())).running == 0 and mem.free_blocks == mem.total_blocks
    for run in (actor.started_at, 0.0):  # meant for this run, or for any
        fresh = msgspec.structs.replace(stale, request_id=f"fresh-{run}", instance_run=run)
        chunks = [c async for c in peer.stream(fresh)]
        assert chunks[-1].finish == "length"
