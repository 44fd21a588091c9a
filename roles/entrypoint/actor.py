"""EntrypointActor: the API gateway. The OpenAI / Anthropic routes come with the gateway; for now
it serves ``GET /health`` on its HTTP address and answers the calls every role answers."""

from __future__ import annotations

from aiohttp import web

from dsi.config import EntrypointOptions
from dsi.roles.entrypoint.health import start_http
from dsi.roles.role import RoleActor


class EntrypointActor(RoleActor):
    def __init__(self, name: str, options: EntrypointOptions) -> None:
        super().__init__(name)
        self.http_host = options.http_host
        self.http_port = options.http_port
        self._runner: web.AppRunner | None = None

    async def on_start(self) -> None:
        self._runner = await start_http(self.http_host, self.http_port)
        await super().on_start()

    async def on_stop(self) -> None:
        await super().on_stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
