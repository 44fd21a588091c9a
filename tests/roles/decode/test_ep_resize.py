"""EP resize: a decode configured for 4 expert-parallel ranks that finds only 3 healthy devices
(``DSI_EP_DEVICES=3`` stands in for a failed one) comes up with a group of 3, a placement that
holds every expert, serves the same tokens, and reports the reduced capacity in its Load (what
its heartbeats carry to the controller)."""

import pytest
import zmq.asyncio

from dsi.config import EngineOptions, ModelConfig
from dsi.engine.engine import Engine, EngineConfig
from dsi.engine.params import SamplingParams
from dsi.eplb import initial_placement, resize
from dsi.eplb.group import DEVICES_ENV
from dsi.messages import ALL
from dsi.messages.control import Load
from dsi.messages.gateway import Generate
from dsi.model.prepare import ensure_model
from dsi.model.weights import load_model
from dsi.roles.decode import DecodeActor
from dsi.roles.engine_role import EngineRoleSettings
from dsi.transport.client import Peer
from dsi.transport.server import ActorServer
from tests.dsi.cli.procs import SHARED_MODEL_DIR


@pytest.mark.slow
@pytest.mark.concurrent
async def test_four_rank_decode_with_three_healthy_ranks(monkeypatch):
    model_dir = ensure_model(SHARED_MODEL_DIR, "tiny")
    monkeypatch.setenv(DEVICES_ENV, "3")
    ctx = zmq.asyncio.Context()
    settings = EngineRoleSettings(
        EngineOptions(max_batch_tokens=512, max_running=4, num_blocks=32, ep_size=4, ep_redundant=1),
        ModelConfig(name="dsi-tiny", dir=model_dir, config="tiny"),
    )
    actor = DecodeActor("decode-ep", settings)
    server = ActorServer(actor, "tcp://127.0.0.1:*", ctx, role="decode")
    await server.start()
    peer = Peer(server.address, ctx, types=ALL, timeout=60)
    try:
        await peer.connect()
        cfg, w = load_model(model_dir)
        assert actor.ep is not None and (actor.ep.size, actor.ep.slots_per_rank) == (3, 3)
        expected = initial_placement(resize(4, 3, cfg.n_experts, 1), cfg.n_layers, cfg.n_experts)
        assert actor.experts is not None
        assert actor.experts.placement.slot_expert.tolist() == expected.slot_expert.tolist()
        assert expected.slot_expert[0].tolist() == [1, 4, 7, 2, 5, 0, 3, 6, 0]

        prompt = [0, 100, 200, 300, 400]
        params = SamplingParams(max_tokens=4, temperature=0)
        chunks = [c async for c in peer.stream(Generate("r1", prompt, params))]
        engine = Engine(cfg, w, EngineConfig(num_blocks=8, num_slots=1, max_running=1))
        engine.add_request("x", prompt, params)
        single = next(o for o in engine.run_until_done() if o.finished).output
        engine.close()
        assert [t for c in chunks for t in c.token_ids] == single

        load = await peer.ask(Load())
        assert (load.ep_ranks, load.ep_configured) == (3, 4) and load.capacity_share() == 0.75
        assert actor.load() == load
    finally:
        await peer.close()
        await server.stop()
        ctx.term()
