"""HTTP errors of the gateway itself (auth, limits, routing) in the shape of the client's protocol.

The bodies come from the recipe's ``error_body``, so a refused request and a gateway error look
the same to a client; this module only adds the OpenAI error types of the gateway's statuses.
"""

from __future__ import annotations

from aiohttp import web

from dsi.recipe.errors import RequestError
from dsi.recipe.errors import error_body as recipe_error_body

_OPENAI_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}


def protocol_of(path: str) -> str:
    return (
        "messages"
        if path.startswith("/v1/messages")
        else "responses"
        if path.startswith("/v1/responses")
        else "chat"
    )


def error_body(
    protocol: str, status: int, message: str, *, param: str | None = None, code: str | None = None
) -> dict:
    kind = _OPENAI_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return recipe_error_body(RequestError(status, message, param=param, code=code, type=kind), protocol)


def error_response(protocol: str, status: int, message: str, **extra: str | None) -> web.Response:
    return web.json_response(error_body(protocol, status, message, **extra), status=status)
