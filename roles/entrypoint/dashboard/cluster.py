"""ClusterView: the controller's instance table and autoscaler state for the dashboard, asked on
the gateway's own controller connection at most once per ``ttl_s``.

    page poll --snapshot()--> fresh (asked less than ttl_s ago)?  the last answer
                              an ask under way?                   wait for it, with the others
                              else: ListInstances() + GetScale(), concurrently

So however many pages poll, one gateway process asks the controller about once a second, and
only while a page is open. When the controller does not answer, the last table is kept and the
snapshot says why it is old.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from dsi.errors import DsiError
from dsi.messages import Message
from dsi.messages.control import GetScale, InstanceTable, ListInstances, ScaleStatus

Ask = Callable[[Message], Awaitable[object]]


@dataclass(slots=True, frozen=True)
class ClusterSnapshot:
    table: InstanceTable | None  # None: the controller has not answered yet
    scale: ScaleStatus | None  # None: autoscaling off, or a controller that does not answer GetScale
    age_s: float  # seconds since the table was answered (0.0 when there is none)
    error: str = ""  # why the last ask failed ("" when it was answered)


class ClusterView:
    """``ask``: asks the controller a message and returns its answer (raises DsiError);
    ``ttl_s``: seconds an answer is served again; ``clock``: monotonic seconds."""

    def __init__(self, ask: Ask, ttl_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._ask, self._ttl_s, self._clock = ask, ttl_s, clock
        self._table: InstanceTable | None = None
        self._scale: ScaleStatus | None = None
        self._answered_at = 0.0
        self._asked_at = -math.inf
        self._error = ""
        self._pending: asyncio.Task | None = None

    async def snapshot(self) -> ClusterSnapshot:
        if self._clock() - self._asked_at >= self._ttl_s:
            if self._pending is None:
                self._pending = asyncio.get_running_loop().create_task(self._fetch())
            # shielded: a page that goes away mid-ask does not cancel the ask the others wait for
            await asyncio.shield(self._pending)
        age = self._clock() - self._answered_at if self._table is not None else 0.0
        return ClusterSnapshot(self._table, self._scale, age, self._error)

    async def _fetch(self) -> None:
        try:
            table, scale = await asyncio.gather(
                self._ask(ListInstances()), self._ask(GetScale()), return_exceptions=True
            )
            if isinstance(table, BaseException) and not isinstance(table, DsiError):
                raise table
            if isinstance(table, DsiError):
                self._error = f"{table.code}: {table.message}"
                return
            if not isinstance(table, InstanceTable):
                self._error = f"the controller answered ListInstances with {type(table).__name__}"
                return
            self._table, self._answered_at, self._error = table, self._clock(), ""
            # GetScale fails on a controller that predates it: no autoscaler part then.
            self._scale = scale if isinstance(scale, ScaleStatus) and scale.enabled else None
        finally:
            self._asked_at = self._clock()
            self._pending = None
