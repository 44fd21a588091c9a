"""BalancerActor: routes prefill and decode requests from the load the engines push.

    LoadReport (tell, from every engine)   -> LoadTable
    controller ListInstances (every refresh_s) -> LoadTable (serving / draining / gone, after a grace)
    RouteQuery (ask, from the entrypoint)  -> Route | NoInstance | InvalidRequest
    TableQuery (ask, from the entrypoint)  -> RouteTable (the plan and loads, for routing there;
                                              ``build_s``: the seconds it took to make)
    BalancerStatus (ask, dsi status)       -> BalancerState (buckets, bands, instances, spread)

The policies are dsi.balance's (prefill length buckets, decode bands); see
dsi.roles.balancer.policies for how ``exclude`` is honoured. The handlers never wait, so a
query is answered inline. The only state besides the policies' measured loads is what the
engines and the controller send; several balancers can run side by side, each fed every
report (the entrypoint asks one of them; another takes over when it goes away).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable

import msgspec
import zmq.asyncio

from dsi.actor import handles
from dsi.config import BalancerOptions
from dsi.errors import DsiError, InvalidRequest
from dsi.messages.balancer import (
    BalancerState,
    BalancerStatus,
    LoadReport,
    Route,
    RouteQuery,
    RouteTable,
    TableQuery,
)
from dsi.messages.control import InstanceTable, ListInstances
from dsi.model.config import ModelConfig
from dsi.roles.balancer.loads import LoadTable
from dsi.roles.balancer.policies import Policies, spread
from dsi.roles.balancer.tables import make_table, measure_routed
from dsi.roles.role import RoleActor
from dsi.transport.client import Peer
from dsi.transport.security import CurveKeys

log = logging.getLogger(__name__)

ROLES = ("prefill", "decode")


class BalancerActor(RoleActor):
    """``controller``: where to learn which instances serve ("" = nobody tells: tests hand the
    table in with :meth:`listed`); ``refresh_s`` seconds between asks; ``clock`` monotonic s."""

    def __init__(
        self,
        name: str,
        options: BalancerOptions,
        model: ModelConfig,
        *,
        controller: str = "",
        keys: CurveKeys | None = None,
        refresh_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(name)
        self.options = options
        self.policies = Policies(options, model)
        self.table = LoadTable(options.report_timeout_s)
        self.routed: Counter[str] = Counter()
        self.reports = 0
        self.tables = 0  # decision tables made
        self.epoch = time.time()
        self._controller_address, self._keys, self._refresh_s = controller, keys, refresh_s
        self._clock = clock
        self._ctx: zmq.asyncio.Context | None = None

    async def on_start(self) -> None:
        if self._controller_address:
            self._ctx = zmq.asyncio.Context()
            self.spawn(self._follow_controller(), name=f"{self.name}.controller")
        await super().on_start()

    async def on_stop(self) -> None:
        await super().on_stop()
        if self._ctx is not None:
            self._ctx.destroy(linger=0)

    def listed(self, table: InstanceTable) -> None:
        self.table.listed(table.instances, self._clock())

    @handles
    def load_report(self, msg: LoadReport) -> None:
        if msg.role not in ROLES:
            raise InvalidRequest(f"a load report comes from a prefill or decode, not {msg.role!r}")
        counts = (
            "queued_tokens",
            "running",
            "waiting",
            "kv_tokens",
            "max_requests",
            "kv_capacity_tokens",
            "accepted",
        )
        negative = [name for name in counts if getattr(msg, name) < 0]
        if negative or not msg.instance_id:
            raise InvalidRequest(
                f"load report of {msg.instance_id!r}: needs an id and counts >= 0 "
                f"(negative: {', '.join(negative) or 'none'})"
            )
        self.reports += 1
        self.table.report(msg, self._clock())

    @handles
    def route(self, msg: RouteQuery) -> Route:
        now = self._clock()
        if msg.role == "prefill":
            if msg.uncached_tokens < 0 or msg.cached_tokens < 0:
                raise InvalidRequest("uncached_tokens and cached_tokens must be >= 0")
            uncached = max(1, msg.uncached_tokens)
            choice = self.policies.route_prefill(
                uncached, msg.cached_tokens, self.table.snapshot("prefill", now), msg.exclude, now
            )
            self.table.routed(choice.instance, uncached, now)
        elif msg.role == "decode":
            if msg.kv_tokens < 0:
                raise InvalidRequest("kv_tokens must be >= 0")
            kv = max(1, msg.kv_tokens)
            choice = self.policies.route_decode(
                kv, self.table.snapshot("decode", now), msg.exclude, msg.colocated
            )
            self.table.routed(choice.instance, kv, now)
        else:
            raise InvalidRequest(f"a balancer routes prefill and decode requests, not {msg.role!r}")
        self.routed[msg.role] += 1
        return Route(choice.instance, self.table.address(choice.instance), choice.bucket, choice.band)

    @handles
    def table(self, msg: TableQuery) -> RouteTable:
        started = time.perf_counter()
        now = self._clock()
        roles = set()
        for r in msg.routed:
            if measure_routed(self.policies, self.table, r, now):
                self.routed[r.role] += 1
                roles.add(r.role)
        self.tables += 1
        made = make_table(
            self.name, self.epoch, self.tables, msg.upto, self.policies, self.table, now, frozenset(roles)
        )
        return msgspec.structs.replace(made, build_s=time.perf_counter() - started)

    @handles
    def status(self, msg: BalancerStatus) -> BalancerState:
        now = self._clock()
        prefills, decodes = self.table.snapshot("prefill", now), self.table.snapshot("decode", now)
        bands = self.policies.decode.bands
        return BalancerState(
            self.name,
            self.policies.buckets(prefills, now),
            list(bands.long),
            bands.threshold or 0,
            self.table.views(now),
            dict(self.routed),
            {"prefill": spread(prefills, "prefill"), "decode": spread(decodes, "decode")},
        )

    async def _follow_controller(self) -> None:
        assert self._ctx is not None
        peer = Peer(
            self._controller_address,
            self._ctx,
            types=(InstanceTable,),
            peer_id=self.name,
            role="balancer",
            keys=self._keys,
            timeout=max(self._refresh_s, 1.0),
        )
        try:
            while True:
                try:
                    if peer.welcome is None:
                        await peer.connect()
                    self.listed(await peer.ask(ListInstances()))
                except DsiError as exc:  # keep the last table; the controller may be restarting
                    log.warning("%s: cannot list instances from the controller: %s", self.name, exc)
                await asyncio.sleep(self._refresh_s)
        finally:
            await peer.close()
