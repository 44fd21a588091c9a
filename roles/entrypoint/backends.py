"""DecodePool: which engine instance serves a request, and the connections to them.

The pool learns the instances from the controller (``ListInstances``, refreshed every
``refresh_s``) and keeps one Peer per instance. It picks the ready instance with the fewest
requests, counting both the load the instance last reported and what this gateway sent it
since. A request whose instance is lost before the first token is retried on another one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import zmq.asyncio

from dsi.errors import DsiError, Overloaded, PeerLost
from dsi.messages import ALL
from dsi.messages.control import InstanceInfo, InstanceTable, ListInstances
from dsi.messages.gateway import Generate, TokenChunk
from dsi.transport.client import Peer
from dsi.transport.security import CurveKeys

log = logging.getLogger(__name__)


class NoInstance(DsiError):
    code = "no_instance"


@dataclass(slots=True)
class _Instance:
    info: InstanceInfo
    peer: Peer
    sent: int = 0  # requests this gateway has in flight there


class DecodePool:
    def __init__(self, controller: str, ctx: zmq.asyncio.Context, *, role: str = "decode",
                 keys: CurveKeys | None = None, refresh_s: float = 1.0, peer_id: str = "entrypoint") -> None:
        self._ctx, self._keys, self._role, self._peer_id = ctx, keys, role, peer_id
        self._controller = Peer(controller, ctx, types=ALL, peer_id=peer_id, role="entrypoint", keys=keys, timeout=2.0)
        self._instances: dict[str, _Instance] = {}
        self._refresh_s = refresh_s
        self._refreshed = 0.0
        self._task: asyncio.Task | None = None

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
            await inst.peer.close()
        await self._controller.close()

    @property
    def ready(self) -> list[str]:
        return [i for i, inst in self._instances.items() if inst.info.state == "ready"]

    async def refresh(self) -> None:
        table: InstanceTable = await self._controller.ask(ListInstances(self._role))
        seen = set()
        for info in table.instances:
            seen.add(info.instance_id)
            inst = self._instances.get(info.instance_id)
            if inst is None or inst.info.address != info.address:
                if inst is not None:
                    await inst.peer.close()
                peer = Peer(info.address, self._ctx, types=ALL, peer_id=self._peer_id, role="entrypoint",
                            keys=self._keys, timeout=60.0)
                peer_task = asyncio.get_running_loop().create_task(peer.connect())
                peer_task.add_done_callback(lambda t: t.exception())  # failures surface on use
                inst = self._instances[info.instance_id] = _Instance(info, peer)
            inst.info = info
        for gone in set(self._instances) - seen:
            await self._instances.pop(gone).peer.close()
        self._refreshed = time.monotonic()

    async def _refresh_loop(self) -> None:
        while True:
            try:
                await self.refresh()
            except DsiError as exc:
                log.warning("cannot refresh the instance list from the controller: %s", exc)
            await asyncio.sleep(self._refresh_s)

    def pick(self, exclude: set[str] = frozenset()) -> _Instance:
        ready = [inst for i, inst in self._instances.items() if inst.info.state == "ready" and i not in exclude]
        if not ready:
            raise NoInstance(f"no ready {self._role} instance")
        return min(ready, key=lambda inst: (inst.info.load.running + inst.info.load.queued + inst.sent,
                                            inst.info.load.kv_tokens))

    async def generate(self, msg: Generate, first_token_timeout: float = 120.0) -> AsyncIterator[TokenChunk]:
        """Stream a request; retried elsewhere if its instance is lost before the first chunk."""
        if not self._instances:
            await self.refresh()
        tried: set[str] = set()
        while True:
            inst = self.pick(tried)
            tried.add(inst.info.instance_id)
            inst.sent += 1
            started = False
            try:
                async for chunk in inst.peer.stream(msg, timeout=first_token_timeout):
                    started = True
                    yield chunk
                return
            except (PeerLost, Overloaded) as exc:
                if started:
                    raise
                log.warning("%s on %s before the first token; trying another instance", exc.code,
                            inst.info.instance_id)
            finally:
                inst.sent -= 1
