"""ScaleFollower: starts and stops a provisioner's instances for the controller's scale targets.

    every `every_s`:  GetScale --> per scaled role: reconcile(declared ids, provisioner.list(),
                                   wanted, stop) --> provisioner.start(id) / stop(id), in the background

The controller decides (:mod:`dsi.roles.controller.scaling`); whoever holds a provisioner follows
(``dsi serve`` with the local one, over a Peer; the controller itself with the kubernetes one, in
process). A start or stop under way is not asked again; one that fails
is logged and the next round tries again with what the provisioner then lists. While the
controller does not answer nothing changes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Mapping, Sequence
from typing import Protocol

from dsi.errors import DsiError
from dsi.messages.control import GetScale, ScaleStatus
from dsi.provision.base import Provisioner, StartFailed
from dsi.provision.reconcile import RUNNING, reconcile

log = logging.getLogger(__name__)


class ScaleSource(Protocol):
    """Where the targets come from: a connected-on-demand Peer of the controller, or the
    controller's own scaler in process. Both raise DsiError when they cannot answer."""

    async def connect(self, timeout: float) -> object: ...

    async def ask(self, msg: GetScale, timeout: float) -> object: ...


class ScaleFollower:
    """`declared`: the role ids of each scaled kind, in config order; `controller`: a Peer of
    the controller (or any ScaleSource); `every_s`: seconds between two rounds."""

    def __init__(
        self,
        provisioner: Provisioner,
        declared: Mapping[str, Sequence[str]],
        controller: ScaleSource,
        every_s: float,
    ) -> None:
        self._provisioner = provisioner
        self._declared = declared
        self._controller = controller
        self._every_s = every_s
        self._busy: dict[str, asyncio.Task] = {}

    async def run(self) -> None:
        await self._connect()
        while True:
            try:
                await self.step()
            except Exception:  # the loop must outlive one bad round
                log.exception("autoscale: following the controller's targets failed")
            await asyncio.sleep(self._every_s)

    async def _connect(self) -> None:
        """Start the Peer; while the controller is away, try again every round."""
        while True:
            try:
                await self._controller.connect(timeout=max(1.0, self._every_s))
                return
            except DsiError as exc:
                log.info("autoscale: controller not reachable yet (%s)", exc)
                await asyncio.sleep(self._every_s)

    async def step(self) -> None:
        """One round: ask the controller, start and stop what differs."""
        try:
            status = await self._controller.ask(GetScale(), timeout=max(1.0, self._every_s))
        except DsiError as exc:
            log.debug("autoscale: no answer from the controller (%s)", exc)
            return
        if isinstance(status, ScaleStatus) and status.enabled:
            self._follow(status)

    async def close(self) -> None:
        """Cancel the starts and stops under way (the provisioner still stops what they began)."""
        for task in self._busy.values():
            task.cancel()
        await asyncio.gather(*self._busy.values(), return_exceptions=True)
        self._busy.clear()

    def _follow(self, status: ScaleStatus) -> None:
        listed = self._provisioner.list()
        for role in status.roles:
            ids = self._declared.get(role.role, ())
            actions = reconcile(ids, listed, role.wanted, role.stop, self._busy)
            running = sum(1 for inst in listed if inst.role_id in ids and inst.state in RUNNING)
            for role_id in actions.stop:
                log.info(
                    "autoscale: stopping %s (%s wants %d, %d running)",
                    role_id,
                    role.role,
                    role.wanted,
                    running,
                )
                self._spawn(role_id, self._provisioner.stop(role_id))
            for role_id in actions.start:
                log.info(
                    "autoscale: starting %s (%s wants %d, %d running)",
                    role_id,
                    role.role,
                    role.wanted,
                    running,
                )
                self._spawn(role_id, self._provisioner.start(role_id))

    def _spawn(self, role_id: str, work: Awaitable[object]) -> None:
        async def run() -> None:
            try:
                await work
            except (StartFailed, ValueError) as exc:  # ValueError: already provisioned or unknown
                log.error("autoscale: %s: %s", role_id, exc)
            except Exception:  # an API or process error: the next round tries again
                log.exception("autoscale: %s: the provisioner failed", role_id)
            finally:
                self._busy.pop(role_id, None)

        self._busy[role_id] = asyncio.get_running_loop().create_task(run(), name=f"autoscale.{role_id}")
