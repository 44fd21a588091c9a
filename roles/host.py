"""RoleHost: the role instances of one process, sharing one ZeroMQ context.

    start:  context (+ CURVE authenticator) -> per role, controllers first:
            addresses (dsi.config.addresses: the host it tells others) -> actor
            -> ActorServer (bind, actor.on_start) -> HeartbeatSender
    stop:   per role, the entrypoints first (they drain their requests in flight while the
            engines of this process still serve them), then in reverse start order:
            actor.stopping() -> heartbeats stop + Goodbye -> server and actor stop
            -> authenticator -> context
    retire: a role that calls ``retire()`` (a drained instance) is stopped alone the same way;
            ``finished`` is set once every role has retired

A controller hosted in the same process starts first and stops last, so the other roles' first
heartbeats and last Goodbyes reach it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import zmq
import zmq.asyncio

from dsi.config import EntrypointOptions, NodeConfig, RoleAddresses, RoleConfig, addresses_of
from dsi.logs import role_context
from dsi.roles.curve import server_keys
from dsi.roles.heartbeat import HeartbeatSender, Identity
from dsi.roles.kinds import make_actor
from dsi.roles.role import RoleActor
from dsi.transport.security import Authenticator, CurveKeys
from dsi.transport.server import ActorServer

log = logging.getLogger(__name__)


class RoleStartError(Exception):
    """A role could not start (address in use, bad key file...); the message names the role."""


@dataclass(slots=True)
class _Running:
    role: RoleConfig
    server: ActorServer
    heartbeat: HeartbeatSender
    actor: RoleActor


ActorFactory = Callable[[RoleConfig, NodeConfig], RoleActor]


class RoleHost:
    """Runs `role_ids` of `cfg` in this process (each id must name a role of `cfg`).

    ``make``: builds each role's actor; a benchmark passes one that puts stand-ins in some roles.
    """

    def __init__(self, cfg: NodeConfig, role_ids: Sequence[str], make: ActorFactory = make_actor) -> None:
        roles = [cfg.role(role_id) for role_id in dict.fromkeys(role_ids)]
        self.cfg = cfg
        self._make = make
        self.roles = sorted(roles, key=lambda role: role.kind != "controller")  # stable: file order
        self._ctx: zmq.asyncio.Context | None = None
        self._auth: Authenticator | None = None
        self._running: list[_Running] = []
        self._watchers: list[asyncio.Task] = []
        self.finished = asyncio.Event()  # every role retired

    @property
    def servers(self) -> dict[str, ActorServer]:
        """The started servers by role id."""
        return {run.role.id: run.server for run in self._running}

    @property
    def heartbeats(self) -> dict[str, HeartbeatSender]:
        return {run.role.id: run.heartbeat for run in self._running}

    async def start(self) -> None:
        """Start every role; on a failure, stop those already started and raise RoleStartError."""
        self._ctx = zmq.asyncio.Context()
        try:
            keys = server_keys(self.cfg.security)
            if keys is not None:
                self._auth = Authenticator(self._ctx, keys)
            for role in self.roles:
                with role_context(role.id):
                    self._running.append(await self._start_role(role, self._ctx, keys))
        except (OSError, ValueError, zmq.ZMQError) as exc:
            await self.stop()
            raise RoleStartError(str(exc)) from exc
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop every started role, the entrypoints first, the others in reverse start order;
        then the authenticator and context."""
        for task in self._watchers:
            if task is not asyncio.current_task():
                task.cancel()
        self._running.sort(key=lambda run: run.role.kind == "entrypoint")  # stable: start order
        while self._running:
            await self._stop_role(self._running.pop())
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None

    async def _stop_role(self, run: _Running, reason: str = "stopped") -> None:
        with role_context(run.role.id):
            run.actor.stopping()
            await run.heartbeat.stop(reason)
            await run.server.stop()
            log.info("%s stopped (%s)", run.role.id, reason)

    async def _retire_when_asked(self, run: _Running) -> None:
        await run.actor.retired.wait()
        if run in self._running:
            self._running.remove(run)
            await self._stop_role(run, run.actor.retire_reason)
        if not self._running:
            self.finished.set()

    async def _start_role(
        self, role: RoleConfig, ctx: zmq.asyncio.Context, keys: CurveKeys | None
    ) -> _Running:
        told = addresses_of(role, self.cfg)  # AddressError (a ValueError): refused to start
        # The actor sees the host the rule found, so its data plane and announcements tell the same.
        role = dataclasses.replace(role, host=told.host)
        actor = self._make(role, self.cfg)
        try:
            server = ActorServer(actor, role.bind, ctx, role=role.kind, keys=keys)
        except zmq.ZMQError as exc:
            raise RoleStartError(f"{role.id}: cannot bind {role.bind}: {exc}") from None
        try:
            await server.start()
        except OSError as exc:  # the entrypoint's HTTP listener
            await server.stop()
            raise RoleStartError(f"{role.id}: {exc}") from None
        identity = Identity(role.id, role.kind, told.host, told.told(server.address), _http(role, told))
        heartbeat = HeartbeatSender(
            actor, identity, self.cfg.cluster.controller, self.cfg.cluster.heartbeat_interval_s, ctx, keys
        )
        await heartbeat.start()
        if role.kind == "controller":  # READY once it lists itself, so `dsi status` shows it at once
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    heartbeat.answered.wait(), max(1.0, self.cfg.cluster.heartbeat_interval_s)
                )
        log.info("%s (%s) serving on %s", role.id, role.kind, identity.address)
        run = _Running(role, server, heartbeat, actor)
        self._watchers.append(asyncio.get_running_loop().create_task(self._retire_when_asked(run)))
        return run


def _http(role: RoleConfig, told: RoleAddresses) -> str:
    """An entrypoint's HTTP address as others reach it (``HOST:PORT``); "" for other roles."""
    options = role.options
    if not isinstance(options, EntrypointOptions):
        return ""
    # bound where the role binds (or on every interface): told as the role's host, as its endpoints
    where = options.http_host
    host = told.http_host if where in ("0.0.0.0", "::", "*", told.bind_host.strip("[]")) else where
    return f"[{host}]:{options.http_port}" if ":" in host else f"{host}:{options.http_port}"
