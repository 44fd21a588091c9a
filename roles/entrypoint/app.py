"""The gateway's aiohttp application: routes, body limit, and the HTTP listener.

    POST /v1/chat/completions   OpenAI Chat Completions
    POST /v1/responses          OpenAI Responses
    POST /v1/messages           Anthropic Messages
    GET  /v1/models             served model names
    GET  /health                200 {"status": "ok", "instances": N decode, "prefill_instances": M}
                                when a request can be served, else 503 with "status":
                                "unavailable" and the "reason" (see ``health_status``), or,
                                once the gateway is stopping, 503 with "status": "draining"
    GET  /metrics               Prometheus text; with ``http_workers = N`` the sum over the N
                                workers, gathered by the one that answered (see
                                dsi.roles.entrypoint.worker_link and .metrics_merge)
    (/health is the view of the one HTTP worker that answered, each following the controller by
    itself; it names itself in the ``X-Dsi-Worker`` header and /health's "worker", as /metrics
    does in its header)
    GET  /openapi.json          the OpenAPI document of these routes
    GET  /dashboard             a live cluster page, polling /dashboard/state.json (see
                                dsi.roles.entrypoint.dashboard; open like /health and /metrics)

A client that disconnects cancels its handler (``handler_cancellation``), which closes the
engine stream and aborts the request on its instance.

Any other path or method is answered 404 / 405 in the shape of the path's protocol by a
catch-all route rather than a middleware: a middleware adds two coroutine frames that every
streamed token's resumption passes through.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from dsi.roles.entrypoint.dashboard import DASHBOARD_PATHS, add_dashboard
from dsi.roles.entrypoint.errors import error_response, protocol_of
from dsi.roles.entrypoint.gateway import Gateway
from dsi.roles.entrypoint.openapi import openapi_document

_CLOSE_WAIT_S = 1.0  # seconds the handlers still running at close get to end
_ROUTES = (("/v1/chat/completions", "chat"), ("/v1/responses", "responses"), ("/v1/messages", "messages"))


def make_app(
    gateway: Gateway,
    models: list[str],
    max_body_bytes: int,
    worker: str = "",
    scrape: Callable[[], Awaitable[str]] | None = None,
) -> web.Application:
    """``worker``: this process's worker id (see dsi.roles.entrypoint.workers); ``scrape``: the
    /metrics text of every worker of the role (None: this gateway is the only one)."""
    app = web.Application(client_max_size=max_body_bytes)
    for path, protocol in _ROUTES:
        app.router.add_post(path, functools.partial(gateway.handle, protocol=protocol))
    created = int(time.time())

    async def list_models(_request: web.Request) -> web.Response:
        data = [{"id": m, "object": "model", "created": created, "owned_by": "dsi"} for m in models]
        return web.json_response({"object": "list", "data": data})

    async def health(_request: web.Request) -> web.Response:
        status, body = health_status(len(gateway.pool.ready), len(gateway.pool.prefill_ready))
        if gateway.draining:
            status, body = 503, {**body, "status": "draining", "reason": "the gateway is stopping"}
        return web.json_response(body | {"worker": worker}, status=status, headers={"X-Dsi-Worker": worker})

    async def metrics(_request: web.Request) -> web.Response:
        text = await scrape() if scrape is not None else gateway.metrics.render()
        return web.Response(text=text, content_type="text/plain", headers={"X-Dsi-Worker": worker})

    async def openapi(_request: web.Request) -> web.Response:
        return web.json_response(openapi_document(models))

    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi)
    add_dashboard(app, gateway, worker)
    known = {path for path, _ in _ROUTES} | {"/v1/models", "/health", "/metrics", "/openapi.json"}
    known |= set(DASHBOARD_PATHS)

    async def unrouted(request: web.Request) -> web.Response:
        status, reason = (405, "Method Not Allowed") if request.path in known else (404, "Not Found")
        return error_response(protocol_of(request.path), status, reason)

    app.router.add_route("*", "/{tail:.*}", unrouted)  # last: every other route is tried first
    return app


def health_status(decode_ready: int, prefill_ready: int) -> tuple[int, dict[str, object]]:
    """(HTTP status, body) of ``/health`` from the ready instances the gateway knows. Every request
    streams from a decode instance, which also prefills when no prefill instance is ready, so
    the cluster can serve exactly when one decode instance is ready; prefill instances alone
    cannot."""
    body: dict[str, object] = {"status": "ok", "instances": decode_ready, "prefill_instances": prefill_ready}
    if decode_ready:
        return 200, body
    reason = "no serving decode instance"
    if prefill_ready:
        reason += f" ({prefill_ready} prefill serving, but a request needs a decode instance to stream from)"
    return 503, {**body, "status": "unavailable", "reason": reason}


async def start_http(app: web.Application, host: str, port: int, reuse_port: bool = False) -> web.AppRunner:
    """``reuse_port``: SO_REUSEPORT, so that other processes' listeners on the port share its
    connections (the kernel spreads them). The gateway drains before its listener closes
    (``Gateway.drain``), so what is still in flight at ``cleanup`` is cut after
    ``_CLOSE_WAIT_S`` rather than aiohttp's 60 s."""
    runner = web.AppRunner(
        app, access_log=None, handle_signals=False, handler_cancellation=True, shutdown_timeout=_CLOSE_WAIT_S
    )
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, reuse_port=reuse_port or None).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner
