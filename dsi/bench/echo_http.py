"""An instant OpenAI-compatible backend: what a router in front of HTTP engine servers talks to.

    POST /v1/chat/completions   stream: one ``chat.completion.chunk`` SSE event per piece of
                                ``pieces`` (cut to ``max_tokens``), each its own write, no wait,
                                the last with ``finish_reason: "length"``, then ``data: [DONE]``;
                                otherwise one ``chat.completion`` JSON body
    GET  /health, /health_generate, /v1/models, /get_model_info, /get_server_info
                                what routers probe before and while they route

``serve_echo_http`` listens on ``ports`` 127.0.0.1 ports in one process (one backend each) and
returns their numbers. ``dsi bench route`` puts vllm-router and sglang-router in front of it.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Sequence

from aiohttp import web

from dsi.roles.entrypoint.app import start_http
from dsi.roles.entrypoint.sse import SSE_HEADERS

_HOST = "127.0.0.1"


class EchoBackend:
    """One backend's handlers; ``served``: chat completions answered to the end."""

    def __init__(self, model: str, pieces: Sequence[str]) -> None:
        if not pieces:
            raise ValueError("an echo backend needs at least one output piece")
        self.model = model
        self.pieces = [json.dumps(p) for p in pieces]  # JSON string literals, quoted once
        self.served = 0
        self._ids = itertools.count()

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        n = max(1, min(int(body.get("max_tokens") or len(self.pieces)), len(self.pieces)))
        rid = f"chatcmpl-echo-{next(self._ids)}"
        head = (
            f'{{"id":"{rid}","object":"chat.completion.chunk","created":{int(time.time())},'
            f'"model":"{self.model}","choices":[{{"index":0,"delta":{{"content":'
        )
        if not body.get("stream"):
            text = "".join(json.loads(p) for p in self.pieces[:n])
            self.served += 1
            return web.json_response({"id": rid, "object": "chat.completion", "created": int(time.time()),
                                      "model": self.model, "choices": [{"index": 0, "finish_reason": "length",
                                      "message": {"role": "assistant", "content": text}}]})  # fmt: skip
        resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
        await resp.prepare(request)
        for i in range(n):
            finish = '"length"' if i == n - 1 else "null"
            await resp.write(f'data: {head}{self.pieces[i]}}},"finish_reason":{finish}}}]}}\n\n'.encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        self.served += 1
        return resp

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        ok = web.json_response  # a fresh response per request: aiohttp responses are single-use

        async def health(_request: web.Request) -> web.Response:
            return ok({"status": "ok"})

        async def models(_request: web.Request) -> web.Response:
            return ok({"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "echo"}]})

        async def model_info(_request: web.Request) -> web.Response:
            return ok({"model_path": self.model, "tokenizer_path": self.model, "is_generation": True})

        for path, handler in (("/health", health), ("/health_generate", health), ("/v1/models", models),
                              ("/get_model_info", model_info), ("/get_server_info", model_info)):  # fmt: skip
            app.router.add_get(path, handler)
        return app


async def serve_echo_http(
    model: str, pieces: Sequence[str], ports: int
) -> tuple[list[web.AppRunner], list[int]]:
    """Start ``ports`` echo backends on 127.0.0.1 (free ports); the caller cleans the runners up."""
    runners: list[web.AppRunner] = []
    numbers: list[int] = []
    for _ in range(ports):
        runner = await start_http(EchoBackend(model, pieces).app(), _HOST, 0)
        runners.append(runner)
        numbers.append(runner.addresses[0][1])
    return runners, numbers
