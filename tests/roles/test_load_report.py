"""LoadReporter: an engine's load reaches every balancer that is up, at once when poked; a
balancer that is down gets nothing queued for it."""

import asyncio
import itertools

import zmq.asyncio

from dsi.config import BalancerOptions
from dsi.messages.balancer import LoadReport
from dsi.model.config import get_config
from dsi.roles.balancer import BalancerActor
from dsi.roles.load_report import LoadReporter
from dsi.transport.server import ActorServer
from tests.dsi.cli.procs import free_port
from tests.roles.balancer.helpers import until


async def test_a_poke_reports_now_and_a_down_balancer_gets_nothing():
    ctx = zmq.asyncio.Context()
    actor = BalancerActor("balancer-0", BalancerOptions(), get_config("tiny"))
    server = ActorServer(actor, "tcp://127.0.0.1:*", ctx, role="balancer")
    await server.start()
    queued = itertools.count()
    down = f"tcp://127.0.0.1:{free_port()}"  # nobody listens here
    reporter = LoadReporter(
        "prefill-0",
        [server.address, down],
        lambda: LoadReport("prefill-0", "prefill", 1.0, queued_tokens=next(queued)),
        ctx,
        interval_s=600.0,
    )  # no periodic report within the test: only pokes send
    await reporter.start()
    try:
        await until(lambda: reporter._peers[0].connected)
        await asyncio.sleep(0.05)  # let the first (unpoked) wait settle
        before = actor.reports
        reporter.poke()
        await until(lambda: actor.reports == before + 1)
        assert reporter.sent == actor.reports  # one per report, to the balancer that is up only
        assert not reporter._peers[1].connected
    finally:
        await reporter.stop()
        await server.stop()
        ctx.destroy(linger=0)
