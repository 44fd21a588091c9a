"""The gateway's routes with a real balancer process: the balancer's choice, ``exclude`` on a
retry, and the local pick once the balancer is killed (asking per request); the routes from
the balancer's decision table (the default mode)."""

import asyncio
import contextlib
import os
import signal
import time

import pytest
import zmq.asyncio

from dsi.engine.params import SamplingParams
from dsi.messages import ALL
from dsi.messages.balancer import BalancerStatus, LoadReport
from dsi.messages.control import Heartbeat, InstanceInfo, InstanceTable, Load
from dsi.messages.gateway import Generate
from dsi.roles.entrypoint.backends import DecodePool
from dsi.transport.client import Peer
from tests.dsi.cli.procs import free_port, local_config, python_module
from tests.roles.balancer.helpers import until
from tests.roles.cluster import role_addresses

pytestmark = pytest.mark.slow

ENGINES = ("prefill-0", "prefill-1", "decode-0", "decode-1")
BOUND_S = 0.2  # balancer_timeout_s: above a loaded CI machine's worst answer, far below the 2 s ask default


def _info(instance_id: str, address: str) -> InstanceInfo:
    return InstanceInfo(
        instance_id, instance_id.split("-")[0], "127.0.0.1", 1, address, "serving", Load(), 0.0, 1.0
    )


@pytest.fixture
async def balanced(procs, tmp_path, request):
    """A controller + balancer process; fake engines heartbeat to the controller and report to
    the balancer; a DecodePool whose controller table lists the same engines (all idle). Its
    route mode is the test's indirect parameter ("ask" without one)."""
    config = local_config(tmp_path, keep=("controller-0", "balancer-0"))
    addresses = role_addresses(config)
    proc = procs.start("balancer", python_module("dsi.cli.role", "--config", str(config)))
    proc.wait_ready()
    ctx = zmq.asyncio.Context()
    engines = {i: f"tcp://127.0.0.1:{free_port()}" for i in ENGINES}
    controller = Peer(addresses["controller-0"], ctx, types=ALL, peer_id="engines")
    balancer = Peer(addresses["balancer-0"], ctx, types=ALL, peer_id="engines")
    await controller.connect()
    await balancer.connect()

    async def beat_and_report():
        while True:
            for i, address in engines.items():
                await controller.ask(
                    Heartbeat(i, i.split("-")[0], "127.0.0.1", 1, address, assigned="serving")
                )
                busy = i == "decode-0"  # the balancer sees decode-0 loaded; the gateway's table does not
                balancer.tell(
                    LoadReport(
                        i,
                        i.split("-")[0],
                        1.0,
                        running=30 if busy else 0,
                        kv_tokens=50_000 if busy else 0,
                        max_requests=64,
                        kv_capacity_tokens=100_000 if i.startswith("decode") else 0,
                    )
                )
            await asyncio.sleep(0.2)

    beating = asyncio.ensure_future(beat_and_report())
    for _ in range(300):  # until the balancer has every engine listed serving and reported
        views = (await balancer.ask(BalancerStatus())).instances
        if sorted(v.instance_id for v in views if v.state == "serving" and v.report_age_s >= 0) == sorted(
            ENGINES
        ):
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError(f"the balancer never saw the engines: {views}")
    pool = DecodePool(
        f"tcp://127.0.0.1:{free_port()}",
        ctx,
        balancers=[addresses["balancer-0"]],
        balancer_timeout_s=BOUND_S,
        route_mode=getattr(request, "param", "ask"),
    )
    table = InstanceTable([_info(i, a) for i, a in engines.items()])

    async def ask(msg, timeout=None):
        return InstanceTable([i for i in table.instances if i.role == msg.role])

    pool.decode._controller.ask = ask  # type: ignore[method-assign]
    pool.prefill._controller.ask = ask  # type: ignore[method-assign]
    await pool.router.start()  # not pool.start(): its controller is the table above
    await pool.refresh()
    await until(lambda: pool.router._peers[0].connected)
    yield pool, proc
    beating.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await beating
    await pool.close()
    await controller.close()
    await balancer.close()
    ctx.destroy(linger=0)


def _msg(n: int) -> Generate:
    return Generate(f"r{n}", list(range(1, 200)), SamplingParams(max_tokens=2))


async def test_balancer_routes_exclude_on_retry_and_the_local_pick_once_it_is_killed(balanced):
    pool, proc = balanced
    inst, pre = await pool._route(_msg(0), set(), set(), wait=False)
    assert inst.info.instance_id == "decode-1"  # the local pick (all idle in its table) is decode-0
    assert pre is not None and pool.router.routes[("prefill", "balancer")] == 1
    retry, _ = await pool._route(_msg(1), {("decode-1", 1.0)}, set(), wait=False)
    assert retry.info.instance_id == "decode-0" and pool.router.routes[("decode", "balancer")] == 2
    _, other = await pool._route(_msg(2), set(), {pre.key}, wait=False)
    assert other is not None and other.key != pre.key
    lines = "\n".join(pool.metric_lines())
    assert 'dsi_route_total{role="decode",source="balancer"} 3' in lines

    # The balancer is killed: the gateway picks locally, within the bound
    assert pool.router.routes[("decode", "local")] == 0
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    started = time.monotonic()
    inst, pre = await pool._route(_msg(1), set(), set(), wait=False)
    elapsed = time.monotonic() - started
    assert inst.info.instance_id == "decode-0" and pre is not None  # the local least loaded
    assert pool.router.routes[("decode", "local")] == 1
    assert {"timeout", "lost", "down"} & set(pool.router.fallbacks), pool.router.fallbacks
    assert elapsed < 1.0  # bounded by balancer_timeout_s, not the 2 s ask default
    # once the balancer is known down, requests do not wait for it at all
    await until(lambda: not pool.router._peers[0].connected or pool.router._down_until[0] > time.monotonic())
    inst, _ = await pool._route(_msg(2), set(), set(), wait=False)
    assert inst.info.instance_id == "decode-0" and pool.router.routes[("decode", "local")] == 2


@pytest.mark.parametrize("balanced", ["table"], indirect=True)
async def test_routes_come_from_the_balancers_table_and_reach_its_loads(balanced):
    pool, _ = balanced
    await until(lambda: pool.router.tables.held is not None)
    picks = [await pool._route(_msg(n), set(), set(), wait=False) for n in range(4)]
    # the table shows decode-0 loaded (30 requests, 50K KV); the gateway's own table does not
    assert [inst.info.instance_id for inst, _ in picks] == ["decode-1"] * 4
    # two idle prefills serve every bucket: the in-flight additions alternate them
    assert [pre.info.instance_id for _, pre in picks] == ["prefill-0", "prefill-1"] * 2
    assert pool.router.routes[("decode", "table")] == 4 and pool.router.routes[("decode", "balancer")] == 0
    lines = "\n".join(pool.metric_lines())
    assert (
        'dsi_route_total{role="prefill",source="table"} 4' in lines
        and "dsi_route_table_age_seconds " in lines
    )
    # the routes go back with the next table query: the balancer counts them
    peer = pool.router._peers[0]

    async def routed():
        return (await peer.ask(BalancerStatus())).routed

    for _ in range(100):
        if await routed() == {"prefill": 4, "decode": 4}:
            break
        await asyncio.sleep(0.05)
    assert await routed() == {"prefill": 4, "decode": 4}
