"""Provisioner: what starts, replaces and stops role instances, whatever runs them.

One instance is one role id of the cluster config. Its lifecycle, as a provisioner reports it::

    start() --> starting --READY--> ready --dies--> backoff --delay--> starting ...
                   |                  |                |
                   +-- not READY -----+-- dies once too often --> failed   (given up)
    stop()  --> stopping --> stopped       (from any state but failed)

A failed first start raises ``StartFailed`` (a bad config or a port in use would fail every
replacement the same way); a replacement that fails counts as one more death.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

InstanceState = Literal["starting", "ready", "backoff", "stopping", "stopped", "failed"]


class StartFailed(Exception):
    """A process exited, printed something else, or stayed silent too long before it was READY."""


@dataclass(slots=True, frozen=True)
class ProvisionedInstance:
    """One instance as its provisioner knows it.

    pid: the process running now (None in backoff, stopped or failed).
    restarts: replacements started so far.
    last_exit: exit status of the last process that ended (negative: killed by that signal).
    """

    role_id: str
    state: InstanceState
    pid: int | None
    restarts: int = 0
    last_exit: int | None = None


class Provisioner(Protocol):
    async def start(self, role_id: str) -> ProvisionedInstance:
        """Start the instance and keep it running; returns once it is READY (StartFailed if not)."""
        ...

    async def stop(self, role_id: str) -> None:
        """Stop the instance and stop replacing it."""
        ...

    def list(self) -> list[ProvisionedInstance]:
        """Every instance started, in start order, as of now (no I/O)."""
        ...

    async def close(self) -> None:
        """Stop every instance, in reverse start order."""
        ...
