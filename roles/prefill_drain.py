"""PrefillDrain: how a prefill instance (dsi's engine or vLLM's) drains.

The gateway sends a draining prefill no new work. After the grace period, once the ``PrefillTo``
calls in flight are answered, the role retires. A cancel within the grace period stops the
drain; after it, the cancel is refused (``IllegalTransition``): the role is already on its way out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from dsi.messages.migrate import DrainOrder
from dsi.roles.controller.lifecycle import IllegalTransition


class PrefillDrain:
    """``in_flight``: the role's PrefillTo calls running (it counts them); ``retire(reason)``
    ends the role."""

    def __init__(self, name: str, retire: Callable[[str], None]) -> None:
        self.name = name
        self.in_flight = 0
        self._retire = retire
        self._task: asyncio.Task | None = None
        self._ends = 0.0  # loop time the grace period of a drain order ends

    def order(self, msg: DrainOrder) -> None:
        loop = asyncio.get_running_loop()
        if msg.cancel:
            if self._task is not None and loop.time() >= self._ends:
                raise IllegalTransition(f"{self.name}: the grace period is over")
            if self._task is not None:
                self._task.cancel()
            self._task = None
        elif self._task is None:
            self._ends = loop.time() + msg.grace_s
            self._task = loop.create_task(self._finish_then_retire(msg.grace_s))

    async def _finish_then_retire(self, grace_s: float) -> None:
        await asyncio.sleep(grace_s)
        while self.in_flight:
            await asyncio.sleep(0.05)
        self._retire("drained")
