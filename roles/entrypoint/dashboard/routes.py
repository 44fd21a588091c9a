"""The dashboard's two routes on the gateway's aiohttp application, and its metrics sampler.

    GET /dashboard              the page (index.html beside this file: HTML, CSS and JS in one
                                file, nothing fetched from elsewhere)
    GET /dashboard/state.json   the state the page polls (see state.py)

The sampler adds a point to the history every ``sample_s`` while the application runs (from
its start-up to its clean-up hooks): a copy of two histograms, so the charts cover the last
minutes already when a page opens.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from importlib.resources import files

from aiohttp import web

from dsi.roles.entrypoint.dashboard.cluster import ClusterView
from dsi.roles.entrypoint.dashboard.history import MetricsHistory
from dsi.roles.entrypoint.dashboard.state import dashboard_state
from dsi.roles.entrypoint.gateway import Gateway

DASHBOARD_PATHS = ("/dashboard", "/dashboard/state.json")
# Nothing but this page's own inline code and its own origin: no CDN, no frames around it.
_PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src data:; frame-ancestors 'none'"
    ),
    "Cache-Control": "no-cache",
}
_SAMPLER = web.AppKey("dashboard_sampler", asyncio.Task)


def add_dashboard(
    app: web.Application, gateway: Gateway, worker: str, sample_s: float = 2.0, keep: int = 300
) -> None:
    """Add the routes and the sampler; ``sample_s``: seconds between history points, ``keep``:
    points kept (300 x 2 s: the last 10 minutes)."""
    page = files(__package__).joinpath("index.html").read_bytes()
    history = MetricsHistory(keep)
    # The pool is looked up per ask, so that an application around a stand-in pool (tests,
    # dsi bench) is built without one.
    view = ClusterView(lambda msg: gateway.pool.decode.ask_controller(msg))

    async def index(_request: web.Request) -> web.Response:
        return web.Response(body=page, content_type="text/html", charset="utf-8", headers=_PAGE_HEADERS)

    async def state(_request: web.Request) -> web.Response:
        router = gateway.pool.router
        balancers = [router.state] if router is not None and router.state is not None else []
        body = dashboard_state(
            await view.snapshot(),
            balancers,
            gateway.metrics,
            history.points,
            worker=worker,
            now=time.time(),
        )
        return web.json_response(body, headers={"Cache-Control": "no-store", "X-Dsi-Worker": worker})

    async def sample_every() -> None:
        while True:
            history.sample(time.time(), gateway.metrics)
            await asyncio.sleep(sample_s)

    async def start_sampler(app: web.Application) -> None:
        app[_SAMPLER] = asyncio.get_running_loop().create_task(sample_every(), name="dashboard sampler")

    async def stop_sampler(app: web.Application) -> None:
        task = app[_SAMPLER]
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app.router.add_get(DASHBOARD_PATHS[0], index)
    app.router.add_get(DASHBOARD_PATHS[1], state)
    app.on_startup.append(start_sampler)
    app.on_cleanup.append(stop_sampler)
