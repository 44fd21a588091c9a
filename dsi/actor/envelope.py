"""Envelope: one message in an actor's inbox plus the channel its answer goes back on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from dsi.errors import DsiError


class ReplyChannel(Protocol):
    """Where the answer to one call goes: a local future, or a frame to a remote caller.

    Exactly one of ``reply`` / ``fail`` / ``end`` closes the channel; later calls are ignored.
    ``key`` identifies the call for cancellation (unique per actor).
    """

    key: Any

    def reply(self, msg: Any) -> None: ...

    def fail(self, err: DsiError) -> None: ...

    async def item(self, msg: Any) -> None: ...

    def end(self) -> None: ...


@dataclass(slots=True)
class Envelope:
    """``channel`` is None for a tell; ``stream`` marks a server-streaming call."""

    msg: Any
    channel: ReplyChannel | None = None
    stream: bool = False
