"""RequestError: a bad request, with what each protocol's error body needs.

    OpenAI (chat, responses)  {"error": {"message", "type", "param", "code"}}
    Anthropic (messages)      {"type": "error", "error": {"type", "message"}}

The HTTP status picks the Anthropic error type; OpenAI bodies carry ``type`` and ``code``.
"""

from __future__ import annotations

from typing import Any, Literal

from dsi.errors import InvalidRequest

Protocol = Literal["chat", "responses", "messages"]
PROTOCOLS: tuple[Protocol, ...] = ("chat", "responses", "messages")

_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


class RequestError(InvalidRequest):
    """A request the recipe refuses. ``param`` is the offending field's path
    (``messages[2].content``), ``code`` the OpenAI error code (``invalid_value``, ...)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = "invalid_value",
        type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.api_code = code
        self.type = type

    def __repr__(self) -> str:
        return f"RequestError({self.status}, {self.message!r}, param={self.param!r}, code={self.api_code!r})"


def error_body(err: RequestError, protocol: Protocol) -> dict[str, Any]:
    """The JSON error body ``protocol``'s clients expect for ``err``."""
    if protocol == "messages":
        message = f"{_dotted(err.param)}: {err.message}" if err.param else err.message
        return {
            "type": "error",
            "error": {"type": _ANTHROPIC_TYPES.get(err.status, "api_error"), "message": message},
        }
    return {"error": {"message": err.message, "type": err.type, "param": err.param, "code": err.api_code}}


def _dotted(param: str) -> str:
    """``messages[0].content`` -> ``messages.0.content``, as Anthropic writes locations."""
    return param.replace("[", ".").replace("]", "")
