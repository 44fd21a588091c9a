"""Simulated engine instances for ``dsi bench control-plane``: many identities in one process.

    one fleet process (spawned by the bench; a few of them share the instances)
      RoleActor "fleet-<pid>" on one ActorServer (127.0.0.1, a free port): answers Hello, Ping
        and Load; every identity of the process advertises this address, so a gateway's
        connection to "an instance" is a real ZeroMQ connection to a real server
      per identity: a SimInstance (its kind, a steady Load) and a real HeartbeatSender: its own
        DEALER socket to the controller, one Heartbeat ask per interval carrying back the last
        Assignment; the senders start at evenly spread phases of the first interval, so the
        beats reach the controller spread out, as a real cluster's do
      one Peer per balancer: every identity's LoadReport (a tell) once per interval, sent in
        ``_REPORT_SLICES`` slices spread over the interval

Simulated: the engine (no model, no requests, no KV), so Load and LoadReport are steady values
drawn once per identity. Real: the messages, the sockets, the heartbeat task and its bookkeeping,
the controller's and the balancer's handling of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass
from multiprocessing.connection import Connection

import uvloop
import zmq
import zmq.asyncio

from dsi.bench.child import serve_until_terminated
from dsi.messages.balancer import LoadReport
from dsi.messages.control import Load
from dsi.roles.heartbeat import HeartbeatSender, Identity
from dsi.roles.role import RoleActor
from dsi.transport.client import Peer, connect_until_up
from dsi.transport.server import ActorServer

HOST = "127.0.0.1"
KINDS = ("prefill", "decode")
_REPORT_SLICES = 10
# Per identity: a DEALER and the two PAIR sockets of its monitor; ZeroMQ's default cap is 1023
# sockets per context.
_SOCKETS_PER_IDENTITY = 3
# What a simulated decode says it can hold (LoadReport capacity): roomy, as a real one's would be.
SIM_MAX_REQUESTS = 256
SIM_KV_CAPACITY_TOKENS = 1 << 20


@dataclass(slots=True, frozen=True)
class FleetSpec:
    """What one fleet process runs: ``ids`` (instance id, kind) beating to ``controller`` every
    ``interval_s`` seconds and reporting load to ``balancers`` as often."""

    controller: str
    balancers: tuple[str, ...]
    ids: tuple[tuple[str, str], ...]
    interval_s: float = 1.0

    def __post_init__(self) -> None:
        if not self.ids:
            raise ValueError("a fleet needs at least one instance")
        bad = sorted({kind for _, kind in self.ids} - set(KINDS))
        if bad:
            raise ValueError(f"a simulated instance is a prefill or a decode, not {', '.join(bad)}")
        if self.interval_s <= 0:
            raise ValueError(f"interval_s must be > 0 seconds, got {self.interval_s}")


def fleet_ids(instances: int, prefill_share: float = 0.5) -> list[tuple[str, str]]:
    """``instances`` (id, kind) pairs: the first ``round(instances * prefill_share)`` prefills
    (``prefill-0000`` ...), the rest decodes (numbered on)."""
    if instances < 1 or not 0 <= prefill_share <= 1:
        raise ValueError(f"need instances >= 1 and 0 <= prefill_share <= 1, got {instances}, {prefill_share}")
    prefills = round(instances * prefill_share)
    kinds = ["prefill" if i < prefills else "decode" for i in range(instances)]
    return [(f"{kind}-{i:04d}", kind) for i, kind in enumerate(kinds)]


def split(ids: list[tuple[str, str]], processes: int) -> list[tuple[tuple[str, str], ...]]:
    """``ids`` dealt round-robin into ``processes`` non-empty groups (fewer when ids are fewer)."""
    n = max(1, min(processes, len(ids)))
    return [tuple(ids[k::n]) for k in range(n)]


class SimInstance(RoleActor):
    """One simulated engine instance: ``ready`` from the start, never started as an actor (its
    heartbeat reads ``state``, ``load()`` and ``fingerprint``). Its counts are drawn once from
    its id, so every run and every process reports the same."""

    def __init__(self, name: str, kind: str) -> None:
        super().__init__(name)
        self.kind = kind
        self.state = "ready"
        rng = random.Random(name)
        self.requests = rng.randrange(0, 16)  # requests it holds
        self.kv_tokens = self.requests * rng.randrange(100, 4_000) if kind == "decode" else 0
        self.queued_tokens = rng.randrange(0, 8_192) if kind == "prefill" else 0

    def load(self) -> Load:
        return Load(running=self.requests, kv_tokens=self.kv_tokens)

    def load_report(self) -> LoadReport:
        decode = self.kind == "decode"
        return LoadReport(
            self.name,
            self.kind,
            self.started_at,
            self.state,
            queued_tokens=self.queued_tokens,
            running=self.requests,
            kv_tokens=self.kv_tokens,
            max_requests=SIM_MAX_REQUESTS if decode else 0,
            kv_capacity_tokens=SIM_KV_CAPACITY_TOKENS if decode else 0,
        )


class Fleet:
    """The simulated instances of one :class:`FleetSpec`, on one ZeroMQ context."""

    def __init__(self, spec: FleetSpec) -> None:
        self.spec = spec
        self.instances = [SimInstance(iid, kind) for iid, kind in spec.ids]
        self.senders: list[HeartbeatSender] = []
        self.reports = 0  # LoadReports told, to every balancer together
        self._ctx: zmq.asyncio.Context | None = None
        self._server: ActorServer | None = None
        self._balancers: list[Peer] = []
        self._tasks: list[asyncio.Task] = []

    @property
    def address(self) -> str:
        """The control-plane endpoint every identity of this fleet advertises."""
        assert self._server is not None, "start the fleet first"
        return self._server.address

    @property
    def heartbeats_sent(self) -> int:
        return sum(s.sent for s in self.senders)

    async def start(self) -> None:
        """Bind the server, then start the heartbeats (spread over one interval, in the
        background) and the load reports."""
        self._ctx = ctx = zmq.asyncio.Context()
        ctx.set(zmq.MAX_SOCKETS, 64 + _SOCKETS_PER_IDENTITY * len(self.instances))
        self._server = ActorServer(RoleActor(f"fleet-{id(self):x}"), f"tcp://{HOST}:*", ctx, role="fleet")
        await self._server.start()
        self.senders = [
            HeartbeatSender(
                inst,
                Identity(inst.name, inst.kind, HOST, self._server.address),
                self.spec.controller,
                self.spec.interval_s,
                ctx,
            )
            for inst in self.instances
        ]
        self._balancers = [
            Peer(a, ctx, peer_id=f"fleet-{id(self):x}", role="engine") for a in self.spec.balancers
        ]
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._start_senders(), name="fleet heartbeats")]
        self._tasks += [loop.create_task(connect_until_up(p, "balancer")) for p in self._balancers]
        if self._balancers:
            self._tasks.append(loop.create_task(self._report_forever(), name="fleet load reports"))

    async def stop(self) -> None:
        """Stop reporting and beating (every identity says Goodbye at once, each bounded by
        dsi.roles.heartbeat.GOODBYE_TIMEOUT_S), then close; a second call does nothing."""
        if self._ctx is None:
            return
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(s.stop() for s in self.senders))
        for peer in self._balancers:
            await peer.close()
        if self._server is not None:
            await self._server.stop()
        self._ctx.destroy(linger=0)
        self._ctx = None

    async def _start_senders(self) -> None:
        gap_s = self.spec.interval_s / len(self.senders)
        for sender in self.senders:
            await sender.start()
            await asyncio.sleep(gap_s)

    async def _report_forever(self) -> None:
        gap_s = self.spec.interval_s / _REPORT_SLICES
        while True:
            for k in range(_REPORT_SLICES):
                for inst in self.instances[k::_REPORT_SLICES]:
                    report = inst.load_report()
                    for peer in self._balancers:
                        if peer.connected:
                            peer.tell(report)
                            self.reports += 1
                await asyncio.sleep(gap_s)


def serve_fleet(conn: Connection, spec: FleetSpec) -> None:
    """A spawned child's main: run ``spec``'s fleet until the parent terminates the process
    (each message from the parent is answered with this process's CPU seconds)."""
    uvloop.run(_serve_fleet(conn, spec))


async def _serve_fleet(conn: Connection, spec: FleetSpec) -> None:
    fleet = Fleet(spec)
    await fleet.start()
    try:
        await serve_until_terminated(conn, int(fleet.address.rpartition(":")[2]))
    finally:
        with contextlib.suppress(Exception):
            await fleet.stop()
