"""HTTP errors in the shape of the protocol the client speaks.

    OpenAI (chat, responses):  {"error": {"message", "type", "param", "code"}}
    Anthropic (messages):      {"type": "error", "error": {"type", "message"}}
"""

from __future__ import annotations

from aiohttp import web

# status -> (OpenAI type, Anthropic type)
_TYPES = {
    400: ("invalid_request_error", "invalid_request_error"),
    401: ("authentication_error", "authentication_error"),
    403: ("permission_error", "permission_error"),
    404: ("not_found_error", "not_found_error"),
    405: ("invalid_request_error", "invalid_request_error"),
    413: ("invalid_request_error", "request_too_large"),
    422: ("invalid_request_error", "invalid_request_error"),
    429: ("rate_limit_error", "rate_limit_error"),
    500: ("server_error", "api_error"),
    503: ("server_error", "overloaded_error"),
    504: ("server_error", "api_error"),
}


def protocol_of(path: str) -> str:
    return "messages" if path.startswith("/v1/messages") else "responses" if path.startswith("/v1/responses") else "chat"


def error_body(protocol: str, status: int, message: str, *, param: str | None = None, code: str | None = None,
               kind: str | None = None) -> dict:
    openai_type, anthropic_type = _TYPES.get(status, ("invalid_request_error" if status < 500 else "server_error",
                                                      "invalid_request_error" if status < 500 else "api_error"))
    if protocol == "messages":
        return {"type": "error", "error": {"type": kind or anthropic_type, "message": message}}
    return {"error": {"message": message, "type": kind or openai_type, "param": param, "code": code}}


def error_response(protocol: str, status: int, message: str, **extra: str | None) -> web.Response:
    return web.json_response(error_body(protocol, status, message, **extra), status=status)
