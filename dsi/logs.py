"""Process logging: plain text for people, or JSON lines for log shippers.

Every record carries the role it came from: the role whose start created the running task (see
``role_context``), else the process's roles. A JSON line looks like::

    {"ts": "2026-01-01T12:00:00.123Z", "level": "info", "logger": "dsi.roles.host",
     "msg": "prefill-0 serving on tcp://127.0.0.1:7110", "role": "prefill-0"}

A record logged with ``extra={"fields": {...}}`` (the gateway's access log, see
dsi.roles.entrypoint.access_log) adds those fields to its JSON line; a text line shows only its
message, which says the same.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
import time
from collections.abc import Iterator
from typing import Literal, TextIO

LogFormat = Literal["text", "json"]
LogLevel = Literal["debug", "info", "warning", "error"]

_ROLE: contextvars.ContextVar[str | None] = contextvars.ContextVar("dsi_role", default=None)
_TEXT = "%(asctime)s %(levelname)s [%(role)s] %(name)s: %(message)s"


@contextlib.contextmanager
def role_context(role_id: str) -> Iterator[None]:
    """Records logged in this block, and by tasks created in it, name `role_id`."""
    token = _ROLE.set(role_id)
    try:
        yield
    finally:
        _ROLE.reset(token)


class _RoleFilter(logging.Filter):
    def __init__(self, default_role: str) -> None:
        super().__init__()
        self.default_role = default_role

    def filter(self, record: logging.LogRecord) -> bool:
        record.role = _ROLE.get() or self.default_role
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (UTC, ISO 8601, ms), level, logger, msg, role [, exc], then
    the record's ``fields`` (they do not replace those before them)."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line: dict[str, object] = {
            "ts": f"{stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            "role": getattr(record, "role", ""),
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            for key, value in fields.items():
                line.setdefault(key, value)
        return json.dumps(line, ensure_ascii=False)


def setup_logging(fmt: LogFormat, level: LogLevel, role: str = "", stream: TextIO | None = None) -> None:
    """Send every log record of this process to `stream` (stderr) in `fmt`; `role` is the default
    role field. Replaces handlers set up before, so calling it twice does not duplicate lines."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(_TEXT))
    handler.addFilter(_RoleFilter(role))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
