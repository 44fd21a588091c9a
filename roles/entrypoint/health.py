"""The entrypoint's HTTP listener; for now only ``GET /health`` -> ``{"status": "ok"}``."""

from __future__ import annotations

from aiohttp import web


async def _health(_request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def start_http(host: str, port: int) -> web.AppRunner:
    """Listen on host:port; the caller stops it with ``await runner.cleanup()``."""
    app = web.Application()
    app.router.add_get("/health", _health)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner
