"""The instances of one role a gateway can send work to, learnt from the controller.

``InstancePool`` learns one role's instances from the controller (``ListInstances``, refreshed
every ``refresh_s``) and keeps one Peer per instance. It picks, among the instances the
controller lists as ``serving`` and whose connection is up, the one with the fewest requests, counting both the load the
instance last reported and what this gateway sent it since. A ``draining`` instance gets no new
work, but the streams already running there go on (their Peer stays open). An instance missing
from the table keeps its last state for ``unlisted_grace_s``: a restarted controller lists the
instances only as their heartbeats reach it, and until then they serve as before (one that
really died drops its connection, and dsi.roles.entrypoint.backends re-routes its requests).
After that it is forgotten, once no request of this gateway runs there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection
from dataclasses import dataclass

import zmq.asyncio

from dsi.errors import DsiError, PeerLost
from dsi.messages import ALL, Message
from dsi.messages.control import InstanceInfo, InstanceTable, ListInstances, TransitionCount
from dsi.roles.controller.lifecycle import InstanceState
from dsi.transport.client import Peer
from dsi.transport.security import CurveKeys

log = logging.getLogger(__name__)

SERVING, DEAD = InstanceState.SERVING, InstanceState.DEAD


class NoInstance(DsiError):
    code = "no_instance"


@dataclass(slots=True)
class _Instance:
    info: InstanceInfo
    peer: Peer
    sent: int = 0  # requests this gateway has in flight there
    missing_since: float | None = None  # monotonic seconds since when the table does not list it
    connecting: asyncio.Task | None = None  # the first connect(), in the background

    async def drop(self) -> None:
        """Stop connecting and close the connection."""
        if self.connecting is not None and not self.connecting.done():
            self.connecting.cancel()
            await asyncio.gather(self.connecting, return_exceptions=True)
        await self.peer.close()

    @property
    def key(self) -> tuple[str, float]:
        """This run of the instance: a restarted instance keeps its id but not its start time."""
        return self.info.instance_id, self.info.started_at


class InstancePool:
    def __init__(
        self,
        controller: str,
        ctx: zmq.asyncio.Context,
        *,
        role: str = "decode",
        keys: CurveKeys | None = None,
        refresh_s: float = 1.0,
        peer_id: str = "entrypoint",
        unlisted_grace_s: float = 10.0,
    ) -> None:
        self._ctx, self._keys, self.role, self._peer_id = ctx, keys, role, peer_id
        self._unlisted_grace_s = unlisted_grace_s  # seconds an instance missing from the table still serves
        self._controller = Peer(
            controller, ctx, types=ALL, peer_id=peer_id, role="entrypoint", keys=keys, timeout=2.0
        )
        self._instances: dict[str, _Instance] = {}
        self._refresh_s = refresh_s
        self._refreshed = 0.0
        self._task: asyncio.Task | None = None
        self.transitions: list[TransitionCount] = []  # the controller's, as of the last refresh

    async def start(self) -> None:
        try:
            await self._controller.connect()
        except DsiError as exc:  # the refresh loop keeps trying; the controller may start later
            log.warning("controller not reachable yet: %s", exc)
        self._task = asyncio.get_running_loop().create_task(self._refresh_loop())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for inst in self._instances.values():
            await inst.drop()
        await self._controller.close()

    async def ask_controller(self, msg: Message, timeout: float = 2.0) -> object:
        """The controller's answer to ``msg`` on this pool's connection (the dashboard's
        ListInstances of every role and GetScale; see dsi.roles.entrypoint.dashboard)."""
        return await self._controller.ask(msg, timeout=timeout)

    @property
    def refreshed(self) -> bool:
        """Whether the controller's table has been read at least once."""
        return self._refreshed > 0

    @property
    def ready(self) -> list[str]:
        """The ids of the instances that take new work (``serving``)."""
        return [i for i, inst in self._instances.items() if self._takes_work(inst)]

    async def refresh(self) -> None:
        table: InstanceTable = await self._controller.ask(ListInstances(self.role))
        self.transitions = table.transitions
        seen = set()
        for info in table.instances:
            seen.add(info.instance_id)
            inst = self._instances.get(info.instance_id)
            # A new address, or a new run of the instance at the same address (restarted, with its
            # id and port): a fresh connection. The old one may be stuck away for good, its Hello
            # after the reconnect having timed out while the new process was still loading.
            if inst is None or inst.info.address != info.address or inst.info.started_at != info.started_at:
                if inst is not None:
                    await inst.drop()
                peer = Peer(
                    info.address,
                    self._ctx,
                    types=ALL,
                    peer_id=self._peer_id,
                    role="entrypoint",
                    keys=self._keys,
                    timeout=60.0,
                )
                connecting = asyncio.get_running_loop().create_task(peer.connect())
                # failures surface on use; reading them here keeps asyncio from logging them
                connecting.add_done_callback(lambda t: t.cancelled() or t.exception())
                inst = self._instances[info.instance_id] = _Instance(info, peer, connecting=connecting)
            if info.state == DEAD and inst.info.state != DEAD:  # missed heartbeats: its calls are dead
                inst.peer.fail_pending(PeerLost(f"{info.instance_id} is dead (missed heartbeats)"))
            inst.info, inst.missing_since = info, None
        now = time.monotonic()
        for gone in set(self._instances) - seen:
            inst = self._instances[gone]
            if inst.missing_since is None:
                inst.missing_since = now
            if not self._takes_work(inst) and not inst.sent:
                await self._instances.pop(gone).drop()
        self._refreshed = now

    def _takes_work(self, inst: _Instance) -> bool:
        """Serving, listed by the controller (or not for longer than ``unlisted_grace_s``), and its
        connection not down: a killed instance is listed as serving until its heartbeats are missed."""
        missing = inst.missing_since
        listed = missing is None or time.monotonic() - missing <= self._unlisted_grace_s
        return inst.info.state == SERVING and listed and not inst.peer.away

    async def _refresh_loop(self) -> None:
        while True:
            try:
                await self.refresh()
            except DsiError as exc:
                log.warning("cannot refresh the instance list from the controller: %s", exc)
            except Exception:  # e.g. no socket left for a new instance: the next refresh tries again
                log.exception("refreshing the %s instances failed", self.role)
            await asyncio.sleep(self._refresh_s)

    def serving(self) -> list[_Instance]:
        """The instances that take new work now."""
        return [inst for inst in self._instances.values() if self._takes_work(inst)]

    def pick(self, exclude: Collection[tuple[str, float]] = frozenset()) -> _Instance:
        """The least loaded serving instance whose ``key`` is not in ``exclude``."""
        ready = [
            inst for inst in self._instances.values() if self._takes_work(inst) and inst.key not in exclude
        ]
        if not ready:
            raise NoInstance(f"no serving {self.role} instance")
        return min(
            ready,
            key=lambda inst: (
                inst.info.load.running + inst.info.load.queued + inst.sent,
                inst.info.load.kv_tokens,
            ),
        )

    def get(self, instance_id: str, exclude: Collection[tuple[str, float]] = frozenset()) -> _Instance | None:
        """The instance ``instance_id`` if it takes new work (as ``pick`` counts it) and its ``key``
        is not in ``exclude``."""
        inst = self._instances.get(instance_id)
        return inst if inst is not None and self._takes_work(inst) and inst.key not in exclude else None
