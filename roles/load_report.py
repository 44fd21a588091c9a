"""LoadReporter: an engine role pushes its load to every balancer (``LoadReport``, a tell).

A report goes out every ``interval_s`` and, sooner, when the load changed: the role calls
``poke()`` when a request arrives or leaves, and the reporter sends at most one report per
``min_gap_s`` (changes in between are coalesced into the next). A balancer that is away gets
nothing (a report is worth only its latest value, so none is queued); when it comes back the
next report reaches it. Balancer addresses come from the config (``[cluster] balancers``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

import zmq.asyncio

from dsi.messages.balancer import LoadReport
from dsi.transport.client import Peer, connect_until_up
from dsi.transport.security import CurveKeys

log = logging.getLogger(__name__)


class LoadReporter:
    """``report`` builds the current LoadReport; ``interval_s`` / ``min_gap_s`` in seconds."""

    def __init__(
        self,
        name: str,
        addresses: Sequence[str],
        report: Callable[[], LoadReport],
        ctx: zmq.asyncio.Context,
        *,
        keys: CurveKeys | None = None,
        interval_s: float = 1.0,
        min_gap_s: float = 0.005,
    ) -> None:
        self.name = name
        self.report = report
        self.interval_s = interval_s
        self.min_gap_s = min_gap_s
        self.sent = 0
        self._peers = [
            Peer(a, ctx, peer_id=name, role="engine", keys=keys, timeout=max(interval_s, 1.0))
            for a in addresses
        ]
        self._changed = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    def poke(self) -> None:
        """The load changed: report soon."""
        self._changed.set()

    async def start(self) -> None:
        if not self._peers:
            return
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._connect(p), name=f"{self.name}.balancer") for p in self._peers]
        self._tasks.append(loop.create_task(self._report_forever(), name=f"{self.name}.load-report"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for peer in self._peers:
            await peer.close()

    def send_now(self) -> None:
        """One report to every balancer that is connected."""
        report = self.report()
        for peer in self._peers:
            if peer.connected:
                peer.tell(report)
                self.sent += 1

    async def _report_forever(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), self.interval_s)
            self._changed.clear()
            try:
                self.send_now()
            except Exception:  # a report must never stop the reporting
                log.exception("%s: sending a load report failed", self.name)
            await asyncio.sleep(self.min_gap_s)

    async def _connect(self, peer: Peer) -> None:
        await connect_until_up(peer, "balancer")
