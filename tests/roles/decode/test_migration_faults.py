"""A drain whose target fails some requests: each such request re-runs from its prompt and its
stream is still the undisturbed one, token for token, while the others still move with their KV.

Real decode actors (the tiny model) behind their servers in this process, a stand-in controller
that hands out the instance table, and the gateway's own ``DecodePool``. Two failures are
injected at the target: one request whose import fails after it was marked moved (its
``Resume`` finds nothing), and one whose ``MigrateIn`` the target refuses."""

from __future__ import annotations

import asyncio

import pytest
import zmq.asyncio

from dsi.actor import Actor, handles
from dsi.config import EngineOptions, ModelConfig
from dsi.engine.params import SamplingParams
from dsi.errors import InvalidRequest
from dsi.messages import ALL
from dsi.messages.control import InstanceInfo, InstanceTable, ListInstances, Load
from dsi.messages.gateway import Generate
from dsi.messages.migrate import DrainOrder, MigrateIn, MigrationLeases
from dsi.model.prepare import ensure_model
from dsi.roles.decode import DecodeActor
from dsi.roles.engine_role import EngineRoleSettings
from dsi.roles.entrypoint.backends import DecodePool
from dsi.transport.client import Peer
from dsi.transport.server import ActorServer
from tests.dsi.cli.procs import SHARED_MODEL_DIR

MAX_TOKENS = 16
REQUESTS = 3
IMPORT_FAILS, REFUSED = "r1", "r2"


class Table(Actor):
    """The controller, as far as the gateway and a draining decode ask it: the instance table."""

    def __init__(self) -> None:
        super().__init__("controller-t")
        self.instances: list[InstanceInfo] = []

    @handles
    async def list_instances(self, msg: ListInstances) -> InstanceTable:
        return InstanceTable([i for i in self.instances if not msg.role or i.role == msg.role])


def info(name: str, address: str, state: str, started_at: float) -> InstanceInfo:
    """As the controller lists it: ``started_at`` is the run's own (requests name it)."""
    return InstanceInfo(name, "decode", "127.0.0.1", 1, address, state, Load(), 0.0, started_at)


def prompt(i: int) -> list[int]:
    return [(37 * i + 11 * k) % 5000 + 3 for k in range(20 + 30 * i)]


def sampling(i: int) -> SamplingParams:
    if i % 2:
        return SamplingParams(max_tokens=MAX_TOKENS, temperature=0.8, seed=100 + i)
    return SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)


@pytest.fixture(scope="module")
def model_dir():
    return ensure_model(SHARED_MODEL_DIR, "tiny")


@pytest.fixture
async def cluster(model_dir):
    """(table, source, target, source server, pool, ctx)."""
    ctx = zmq.asyncio.Context()
    table = Table()
    control = ActorServer(table, "tcp://127.0.0.1:*", ctx, role="controller")
    await control.start()
    settings = EngineRoleSettings(
        EngineOptions(max_batch_tokens=512, max_running=8),
        ModelConfig(name="dsi-tiny", dir=model_dir, config="tiny"),
        controller=control.address,
        lease_timeout_s=10.0,
    )
    source, target = DecodeActor("decode-0", settings), DecodeActor("decode-1", settings)
    servers = [ActorServer(a, "tcp://127.0.0.1:*", ctx, role="decode") for a in (source, target)]
    for s in servers:
        await s.start()
    table.instances = [
        info("decode-0", servers[0].address, "serving", source.started_at),
        info("decode-1", servers[1].address, "ready", target.started_at),
    ]
    pool = DecodePool(control.address, ctx, refresh_s=0.1, reroute_wait_s=5.0, item_timeout_s=30.0)
    await pool.start()
    await pool.refresh()
    yield table, source, target, servers[0], pool, ctx
    await pool.close()
    for s in servers:
        await s.stop()
    await control.stop()
    ctx.destroy(linger=0)


async def collect(pool: DecodePool, request_id: str, i: int) -> list[int]:
    tokens, finish = [], ""
    async for chunk in pool.generate(Generate(request_id, prompt(i), sampling(i))):
        tokens += chunk.token_ids
        finish = chunk.finish or finish
    assert finish == "length", finish
    return tokens


def inject_failures(target: DecodeActor) -> None:
    """At the target: ``IMPORT_FAILS`` is taken in, then its import fails; ``REFUSED`` is refused."""
    assert target.service is not None
    service = target.service
    import_request = service.import_request

    def failing_import(state, *args, **kwargs):
        if state.request_id == IMPORT_FAILS:
            raise InvalidRequest(f"{IMPORT_FAILS}: no room (injected)")
        return import_request(state, *args, **kwargs)

    service.import_request = failing_import  # type: ignore[method-assign]
    migrate_in = target.arrivals.migrate_in

    async def refusing(msg: MigrateIn) -> MigrationLeases:
        if any(m.request_id == REFUSED for m in msg.migrants):
            raise InvalidRequest(f"{REFUSED}: refused (injected)")
        return await migrate_in(msg)

    target.arrivals.migrate_in = refusing  # type: ignore[method-assign]


async def test_a_drain_with_failing_imports_reruns_those_requests_and_moves_the_others(cluster):
    table, source, target, source_server, pool, ctx = cluster
    undisturbed = await asyncio.gather(*(collect(pool, f"u{i}", i) for i in range(REQUESTS)))  # on decode-0
    inject_failures(target)
    streams = [asyncio.ensure_future(collect(pool, f"r{i}", i)) for i in range(REQUESTS)]
    while len(source.live) < REQUESTS:  # every request decodes on the source
        await asyncio.sleep(0.01)
    table.instances = [
        info("decode-0", table.instances[0].address, "draining", source.started_at),
        info("decode-1", table.instances[1].address, "serving", target.started_at),
    ]
    await pool.refresh()
    peer = Peer(source_server.address, ctx, types=ALL, timeout=10)
    await peer.connect()
    await peer.ask(DrainOrder(grace_s=0.2))
    got = await asyncio.wait_for(asyncio.gather(*streams), 60.0)
    await peer.close()
    assert got == undisturbed
    assert source.migration is not None
    report = source.migration.report
    assert (report.moved, report.rerun) == (REQUESTS - 1, 1)  # the refused one re-ran from the source's side
    assert target.counters.migrated_in == REQUESTS - 2  # the others were imported and finished there
    assert pool.failed_moves == 1  # the one whose import failed: re-run when its Resume found nothing
    assert pool.migrations == REQUESTS
