"""Two balancers side by side, in this process over real sockets: an engine's reports reach
both, the router asks the first while it is up and the second once the first is gone."""

import zmq.asyncio

from dsi.config import BalancerOptions
from dsi.messages.balancer import LoadReport, Route
from dsi.model.config import get_config
from dsi.roles.balancer import BalancerActor
from dsi.roles.entrypoint.router import Ask, BalancerRouter
from dsi.roles.load_report import LoadReporter
from dsi.transport.server import ActorServer
from tests.roles.balancer.helpers import table, until


async def test_the_second_balancer_takes_over_when_the_first_goes_away():
    ctx = zmq.asyncio.Context()
    actors = [BalancerActor(f"balancer-{i}", BalancerOptions(), get_config("tiny")) for i in range(2)]
    servers = [ActorServer(a, "tcp://127.0.0.1:*", ctx, role="balancer") for a in actors]
    for actor, server in zip(actors, servers, strict=True):
        await server.start()
        actor.listed(table(**{"prefill-0": "serving", "decode-0": "serving"}))
    addresses = [s.address for s in servers]
    reporters = [
        LoadReporter(
            i,
            addresses,
            lambda i=i: LoadReport(i, i.split("-")[0], 1.0, max_requests=64, kv_capacity_tokens=100_000),
            ctx,
            interval_s=0.1,
        )
        for i in ("prefill-0", "decode-0")
    ]
    router = BalancerRouter(addresses, ctx, bound_s=0.5, retry_after_s=60.0, mode="ask")
    for r in reporters:
        await r.start()
    await router.start()
    try:
        await until(lambda: all(a.reports >= 2 for a in actors) and router._choose() == 0)
        pre, dec, _ = await router.route(Ask(100, 0), prefill=True)
        assert isinstance(pre, Route) and isinstance(dec, Route)
        assert (dict(actors[0].routed), dict(actors[1].routed)) == ({"prefill": 1, "decode": 1}, {})
        await servers[0].stop()  # the first balancer goes away
        await until(lambda: router._choose() == 1)
        pre, dec, _ = await router.route(Ask(100, 0), prefill=True)
        assert (pre.instance_id, dec.instance_id) == ("prefill-0", "decode-0")
        assert dict(actors[1].routed) == {"prefill": 1, "decode": 1}  # it had every report already
    finally:
        await router.close()
        for r in reporters:
            await r.stop()
        await servers[1].stop()
        ctx.destroy(linger=0)
