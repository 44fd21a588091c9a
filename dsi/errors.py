"""Typed errors that cross process boundaries as data.

Every error a role can report to a caller has a stable ``code``. On the wire it travels as
``ErrorInfo(code, message)``; the caller's runtime turns it back into the matching exception
class with :func:`error_from_info`, so ``except PeerLost`` works on either side of a socket.
"""

from __future__ import annotations

import msgspec


class ErrorInfo(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """An error as data: ``code`` selects the exception class, ``message`` is for humans."""

    code: str
    message: str


class DsiError(Exception):
    """Base of every typed dsi error."""

    code = "internal"

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.code)
        self.message = message or self.code

    def info(self) -> ErrorInfo:
        return ErrorInfo(self.code, self.message)


class BadMessage(DsiError):
    """A frame or message that cannot be decoded or validated at the boundary."""

    code = "bad_message"


class VersionMismatch(DsiError):
    """The peer speaks another wire protocol version."""

    code = "version_mismatch"


class UnknownMessage(DsiError):
    """A well-formed message that this role has no handler for."""

    code = "unknown_message"


class HandlerError(DsiError):
    """The remote handler raised; the role itself keeps serving."""

    code = "handler_error"


class Overloaded(DsiError):
    """The role's inbox is full; retry later or elsewhere."""

    code = "overloaded"


class ActorStopped(DsiError):
    """The actor stopped before it handled (or finished) the message."""

    code = "actor_stopped"


class AskTimeout(DsiError):
    """No reply within the per-call timeout."""

    code = "timeout"


class PeerLost(DsiError):
    """The connection to the peer dropped while the call was pending."""

    code = "peer_lost"


class Cancelled(DsiError):
    """The caller cancelled the call (for example, the HTTP client went away)."""

    code = "cancelled"


class InvalidRequest(DsiError):
    """The request itself is bad (bad parameters); never retried."""

    code = "invalid_request"


class TransferFailed(DsiError):
    """A KV data-plane transfer failed: refused, unknown transfer id, or the other side went away."""

    code = "transfer_failed"


class TransferTimeout(DsiError):
    """A KV data-plane transfer did not complete within its timeout."""

    code = "transfer_timeout"


_BY_CODE: dict[str, type[DsiError]] = {
    cls.code: cls
    for cls in (
        DsiError,
        BadMessage,
        VersionMismatch,
        UnknownMessage,
        HandlerError,
        Overloaded,
        ActorStopped,
        AskTimeout,
        PeerLost,
        Cancelled,
        InvalidRequest,
        TransferFailed,
        TransferTimeout,
    )
}


def register_error(cls: type[DsiError]) -> type[DsiError]:
    """Class decorator: make a role-specific error class travel by its code."""
    _BY_CODE[cls.code] = cls
    return cls


def error_from_info(info: ErrorInfo) -> DsiError:
    """The exception for an ``ErrorInfo`` received from a peer (unknown codes stay DsiError)."""
    cls = _BY_CODE.get(info.code, DsiError)
    err = cls(info.message)
    if cls is DsiError:
        err.code = info.code
    return err
