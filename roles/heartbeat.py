"""HeartbeatSender: tells the controller that one role instance is alive, every interval.

The first heartbeat registers the instance; each carries its state and Load, an engine's machine
fingerprint, and the lifecycle state the controller last assigned (its answer to the previous
heartbeat, an ``Assignment``).
The Peer's socket queues heartbeats while the controller is away and ZeroMQ reconnects by itself,
so a restarted controller learns every instance again within one interval, serving ones as
serving (controller state is soft). A heartbeat's answer is awaited for at most one interval;
``answered`` is set at the first answer (the controller lists the instance from then on). ``stop``
asks a Goodbye (bounded by GOODBYE_TIMEOUT_S), so the controller lists the instance as stopped
rather than lost.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass

import zmq.asyncio

from dsi.errors import DsiError
from dsi.messages.control import Assignment, Goodbye, Heartbeat
from dsi.messages.version import PROTOCOL_VERSION
from dsi.roles.role import RoleActor
from dsi.transport.client import Peer
from dsi.transport.security import CurveKeys

log = logging.getLogger(__name__)

GOODBYE_TIMEOUT_S = 1.0


@dataclass(slots=True, frozen=True)
class Identity:
    """What a heartbeat says about the instance besides its state and load."""

    instance_id: str
    role: str  # the role kind
    host: str
    address: str  # control-plane endpoint others connect to
    http: str = ""  # HOST:PORT of an entrypoint


class HeartbeatSender:
    """One role's heartbeat task; `interval_s` in seconds."""

    def __init__(
        self,
        actor: RoleActor,
        identity: Identity,
        controller: str,
        interval_s: float,
        ctx: zmq.asyncio.Context,
        keys: CurveKeys | None = None,
    ) -> None:
        self.actor = actor
        self.identity = identity
        self.interval_s = interval_s
        self.sent = 0
        self.assigned = ""  # the lifecycle state the controller answered last
        self.answered = asyncio.Event()  # set at the controller's first answer: it lists us
        self._peer = Peer(
            controller,
            ctx,
            types=(Assignment,),
            peer_id=identity.instance_id,
            role=identity.role,
            keys=keys,
            timeout=max(interval_s, GOODBYE_TIMEOUT_S),
        )
        self._beating: asyncio.Task | None = None
        self._connecting: asyncio.Task | None = None

    def beat(self) -> Heartbeat:
        ident = self.identity
        return Heartbeat(
            instance_id=ident.instance_id,
            role=ident.role,
            host=ident.host,
            pid=os.getpid(),
            address=ident.address,
            state=self.actor.state,
            load=self.actor.load(),
            started_at=self.actor.started_at,
            http=ident.http,
            assigned=self.assigned,
            fingerprint=self.actor.fingerprint,
            protocol=PROTOCOL_VERSION,
        )

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        name = f"{self.identity.instance_id}.heartbeat"
        self._beating = loop.create_task(self._beat_every_interval(), name=name)
        self._connecting = loop.create_task(self._connect(), name=f"{name}.connect")

    async def stop(self, reason: str = "stopped") -> None:
        """Stop beating, say Goodbye (best effort, bounded), close the connection."""
        if self._beating is not None:
            self._beating.cancel()
            await asyncio.gather(self._beating, return_exceptions=True)
        try:
            # The connect task keeps running meanwhile: it starts the Peer's receive side, which
            # the Goodbye's answer needs even when the role stops right after it started.
            await self._peer.ask(Goodbye(self.identity.instance_id, reason), timeout=GOODBYE_TIMEOUT_S)
        except DsiError as exc:
            log.warning("%s: the controller did not take the Goodbye: %s", self.identity.instance_id, exc)
        finally:
            if self._connecting is not None:
                self._connecting.cancel()
                await asyncio.gather(self._connecting, return_exceptions=True)
            await self._peer.close()

    async def _beat_every_interval(self) -> None:
        while True:
            answer = asyncio.ensure_future(self._peer.ask(self.beat(), timeout=self.interval_s))
            if not self.answered.is_set():
                answer.add_done_callback(self._note_answer)
            self.sent += 1
            await asyncio.sleep(self.interval_s)
            await self._take(answer)

    def _note_answer(self, answer: asyncio.Future) -> None:
        if not answer.cancelled() and answer.exception() is None and isinstance(answer.result(), Assignment):
            self.answered.set()  # `assigned` is taken when the interval ends, as for every answer

    async def _take(self, answer: asyncio.Future) -> None:
        """Keep the Assignment of one heartbeat; no answer (controller away) keeps the last one."""
        try:
            reply = await answer
        except DsiError:
            return
        if isinstance(reply, Assignment):
            self.assigned = reply.state

    async def _connect(self) -> None:
        """Start the Peer's receive side; heartbeats are queued by the socket meanwhile."""
        try:
            await self._peer.connect()
        except DsiError as exc:
            log.info(
                "%s: controller %s not reachable yet (%s); heartbeats are queued until it is",
                self.identity.instance_id,
                self._peer.address,
                exc,
            )
