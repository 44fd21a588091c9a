"""Chunks lost or repeated between a decode and the gateway: the caller's stream is the
undisturbed one, token for token. Real decode actors (the tiny model) behind their servers in
this process; the gateway's own ``DecodePool`` routes; the controller's table is handed in. The
fault is injected in the decode's server: one stream item is not sent, or is sent twice."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
import zmq.asyncio

from dsi.config import EngineOptions, ModelConfig
from dsi.engine.params import SamplingParams
from dsi.messages.control import InstanceInfo, InstanceTable, ListInstances, Load
from dsi.messages.gateway import Generate, TokenChunk
from dsi.model.prepare import ensure_model
from dsi.roles.decode import DecodeActor
from dsi.roles.engine_role import EngineRoleSettings
from dsi.roles.entrypoint.backends import DecodePool
from dsi.transport.ports import free_port
from dsi.transport.server import ActorServer
from dsi.transport.wire import Kind
from tests.dsi.cli.procs import SHARED_MODEL_DIR

PROMPT = [0, 100, 200, 300, 400, 500]
GREEDY = SamplingParams(max_tokens=8, temperature=0.0)
SEEDED = SamplingParams(max_tokens=8, temperature=0.9, seed=77)


@pytest.fixture(scope="module")
def model_dir():
    return ensure_model(SHARED_MODEL_DIR, "tiny")


class Faults:
    """Wraps the servers' stream sends. After ``arm``, each server counts the items it sends
    (1, 2, ...): the ``drop``-th is left out (once in all: a re-run elsewhere loses nothing), the
    ``repeat``-th ones are sent twice."""

    def __init__(self, servers: dict[str, ActorServer]) -> None:
        self.drop: int | None = None
        self.repeat: set[int] = set()
        self.items = dict.fromkeys(servers, 0)
        for name, server in servers.items():
            server.send_async = self._wrap(name, server.send_async)  # type: ignore[method-assign]

    def arm(self, drop: int | None = None, repeat: tuple[int, ...] = ()) -> None:
        self.drop, self.repeat = drop, set(repeat)
        self.items = dict.fromkeys(self.items, 0)

    def _wrap(self, name: str, send):
        async def send_async(identity: bytes, kind: Kind, call_id: int, msg: object, *rest) -> None:
            self.items[name] += 1
            n = self.items[name]
            if n == self.drop:
                self.drop = None
                return
            await send(identity, kind, call_id, msg, *rest)
            if n in self.repeat:
                await send(identity, kind, call_id, msg, *rest)

        return send_async


@pytest.fixture
async def cluster(model_dir):
    """(pool, faults, table): two decodes the pool sees as serving (``table``: what the
    controller lists)."""
    ctx = zmq.asyncio.Context()
    settings = EngineRoleSettings(
        EngineOptions(max_batch_tokens=512, max_running=8),
        ModelConfig(name="dsi-tiny", dir=model_dir, config="tiny"),
    )
    actors = {name: DecodeActor(name, settings) for name in ("decode-0", "decode-1")}
    servers = {name: ActorServer(a, "tcp://127.0.0.1:*", ctx, role="decode") for name, a in actors.items()}
    for server in servers.values():
        await server.start()
    infos = [  # as the controller lists them: each run's own started_at (requests name it)
        InstanceInfo(
            name, "decode", "127.0.0.1", 1, s.address, "serving", Load(), 0.0, actors[name].started_at
        )
        for name, s in servers.items()
    ]
    pool = DecodePool(f"tcp://127.0.0.1:{free_port()}", ctx, reroute_wait_s=1.0, item_timeout_s=30.0)

    async def ask(msg: ListInstances, timeout: float | None = None) -> InstanceTable:
        return InstanceTable(infos if msg.role == "decode" else [])

    pool.decode._controller.ask = ask  # type: ignore[method-assign]
    pool.prefill._controller.ask = ask  # type: ignore[method-assign]
    await pool.refresh()
    for inst in pool.decode._instances.values():
        await inst.peer.connect()
    yield pool, Faults(servers), infos
    await pool.close()
    for s in servers.values():
        await s.stop()
    ctx.destroy(linger=0)


async def run(pool: DecodePool, request_id: str, sampling: SamplingParams) -> tuple[list[int], str]:
    chunks: list[TokenChunk] = [c async for c in pool.generate(Generate(request_id, PROMPT, sampling))]
    return [t for c in chunks for t in c.token_ids], chunks[-1].finish


@pytest.mark.parametrize(
    ("sampling", "lost"), [(GREEDY, 3), (SEEDED, 8)], ids=["greedy, a middle chunk", "seeded, the last chunk"]
)
async def test_a_lost_chunk_is_rerun_and_the_stream_is_the_undisturbed_one(cluster, sampling, lost):
    pool, faults, _ = cluster
    undisturbed = await run(pool, "u", sampling)
    assert undisturbed[1] == "length" and len(undisturbed[0]) == sampling.max_tokens
    faults.arm(drop=lost)  # the next stream's item ``lost``, wherever it runs
    assert await asyncio.wait_for(run(pool, "d", sampling), 30.0) == undisturbed
    assert (pool.chunk_gaps, pool.retries, pool.chunk_duplicates) == (1, 1, 0)
    assert "dsi_stream_chunk_gaps_total 1" in pool.metric_lines()


async def test_a_lost_chunk_on_the_only_decode_is_rerun_there_under_another_id(cluster):
    pool, faults, table = cluster
    table[1] = msgspec.structs.replace(table[1], state="draining")  # decode-0 alone serves
    await pool.refresh()
    undisturbed = await run(pool, "u", GREEDY)
    faults.arm(drop=2)
    assert await asyncio.wait_for(run(pool, "d", GREEDY), 30.0) == undisturbed
    assert (pool.chunk_gaps, pool.retries) == (1, 1)
    assert faults.items["decode-1"] == 0  # both runs were on decode-0


async def test_a_repeated_chunk_is_dropped(cluster):
    pool, faults, _ = cluster
    undisturbed = await run(pool, "u", GREEDY)
    faults.arm(repeat=(2, 5))
    assert await run(pool, "d", GREEDY) == undisturbed
    assert (pool.chunk_duplicates, pool.chunk_gaps, pool.retries) == (2, 0, 0)
