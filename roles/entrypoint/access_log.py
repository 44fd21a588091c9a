"""The gateway's access log: one line per HTTP API request, on the logger ``dsi.access`` (info).

It goes where the role's log goes, in its format (``[logging] format`` or ``dsi-role
--log-format``): ``key=value`` pairs after the usual text prefix, or with ``json`` the fields
below as keys of the line's object (beside ts, level, logger, msg, role; see dsi.logs)::

    request_id      the request's id ("-": refused before it had one, as a 401 or a 429)
    route           the HTTP path, as /v1/chat/completions
    protocol        chat | responses | messages
    worker          the HTTP worker that served it (X-Dsi-Worker)
    key_name        the API key's name from the keys file (never the key); "-" unauthenticated
    prefill, decode the instances of its last attempt ("-": none, as colocated or refused)
    prompt_tokens   tokens of the rendered prompt
    cached_tokens   prompt tokens the engine reused from the KV store (what usage reports)
    output_tokens   tokens the engine generated
    ttft_ms         request received -> first token from the engine, milliseconds (null: none)
    total_ms        request received -> response complete, milliseconds
    status          HTTP status (200 for a stream once it began, even if it ended in an
                    error event or its client left; 499: the client left before an answer began)
    finish_reason   stop | stop_sequence | length | tool_calls | abort | error, client_gone /
                    slow_reader (the client left), "-" (no generation)

A text line::

    2026-01-01 12:00:00,123 INFO [entrypoint-0] dsi.access: request_id=chatcmpl-1f2e... route=/v1/chat/completions
    protocol=chat worker=entrypoint-0 key_name=team-a prefill=prefill-0 decode=decode-1 prompt_tokens=412
    cached_tokens=384 output_tokens=57 ttft_ms=48.2 total_ms=912.5 status=200 finish_reason=stop
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from dsi.roles.entrypoint.backends import Placement

ACCESS_LOGGER = "dsi.access"
CLIENT_CLOSED = 499  # the status of a request whose client left before it was answered

log = logging.getLogger(ACCESS_LOGGER)


@dataclass(slots=True)
class AccessRecord:
    """What one request did, filled in along its way through the gateway. ``start`` and
    ``first_token`` are ``time.perf_counter()`` seconds (0.0: no token yet)."""

    route: str
    protocol: str
    worker: str
    start: float
    request_id: str = ""
    key_name: str = ""
    placement: Placement = field(default_factory=Placement)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    first_token: float = 0.0
    status: int = CLIENT_CLOSED
    finish_reason: str = ""

    def fields(self, now: float) -> dict[str, str | int | float | None]:
        """The line's fields at ``now`` (perf_counter seconds), in the documented order."""
        ttft = round((self.first_token - self.start) * 1000, 1) if self.first_token else None
        return {
            "request_id": self.request_id or "-",
            "route": self.route,
            "protocol": self.protocol,
            "worker": self.worker,
            "key_name": self.key_name or "-",
            "prefill": self.placement.prefill or "-",
            "decode": self.placement.decode or "-",
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "output_tokens": self.output_tokens,
            "ttft_ms": ttft,
            "total_ms": round((now - self.start) * 1000, 1),
            "status": self.status,
            "finish_reason": self.finish_reason or "-",
        }


def log_access(record: AccessRecord) -> None:
    """Write ``record``'s line (nothing when the access logger is below info)."""
    if not log.isEnabledFor(logging.INFO):
        return
    fields = record.fields(time.perf_counter())
    text = " ".join(f"{k}={'-' if v is None else v}" for k, v in fields.items())
    log.info(text, extra={"fields": fields})
