"""Decoding a request body into protocol structs: every failure is a RequestError that names
the offending field (``messages[1].content``)."""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec

from dsi.recipe.errors import RequestError

T = TypeVar("T")

_FIELD_RE = re.compile(r"field `([^`]+)`")


class Wire(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Base of every request struct: unknown fields are refused, as both APIs do."""


def decode(body: bytes | str | dict[str, Any], type_: type[T]) -> T:
    """``body`` (JSON text or an already parsed dict) as ``type_``, or a 400 RequestError."""
    try:
        if isinstance(body, dict):
            return msgspec.convert(body, type_)
        if isinstance(body, str):
            body = body.encode("utf-8", "surrogatepass")
        return msgspec.json.decode(body, type=type_)
    except msgspec.ValidationError as exc:
        raise _validation_error(str(exc)) from None
    except (msgspec.DecodeError, UnicodeError) as exc:
        raise RequestError(400, f"The request body is not valid JSON: {exc}", code="invalid_json") from None


def _validation_error(text: str) -> RequestError:
    message, _, where = text.partition(" - at `")
    path = where.rstrip("`").removeprefix("$").lstrip(".") or None
    field = _FIELD_RE.search(message)
    if message.startswith("Object contains unknown field"):
        param = _join(path, field.group(1) if field else "")
        return RequestError(
            400, f"Unrecognized request argument supplied: {param}", param=param, code="unknown_parameter"
        )
    if message.startswith("Object missing required field"):
        param = _join(path, field.group(1) if field else "")
        return RequestError(
            400, f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
        )
    code = "invalid_type" if message.startswith("Expected") else "invalid_value"
    where_text = f"'{path}'" if path else "the request body"
    return RequestError(400, f"Invalid type or value for {where_text}: {message}", param=path, code=code)


def _join(path: str | None, name: str) -> str:
    return f"{path}.{name}" if path else name


def fail(
    message: str, param: str | None = None, code: str = "invalid_value", status: int = 400
) -> RequestError:
    """A RequestError to raise: ``raise fail("...", "messages[0]")``."""
    return RequestError(status, message, param=param, code=code)
