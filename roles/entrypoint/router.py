"""BalancerRouter: the entrypoint asks a balancer where each request goes, within a bound.

    request --RouteQuery(prefill) + RouteQuery(decode), concurrently--> one balancer
            <-- Route, Route                     (typically well under a millisecond)
            <-- nothing within ``bound_s``, or an error --> None: the caller picks locally

The balancer asked is the first of the configured ones (``[cluster] balancers``, in order)
whose connection is up and that has not failed in the last ``retry_after_s`` seconds, so every
entrypoint sends its traffic to the same balancer while it lives, and the balancer's measured
bucket loads see the whole stream. A balancer that times out or goes away is skipped for
``retry_after_s`` (one request pays the bound, the next ones go straight to the next balancer or
to the local pick). A balancer that knows no instance for the request (``NoInstance``) is not
a failure: the local pick decides, and says so if nothing can serve.

``mode = "table"`` (the default, ``[entrypoint] route_mode``): the gateway routes from a
decision table it takes from the balancers every ``table_every_s`` (see
dsi.roles.entrypoint.route_table), with the balancers' own rules and its own in-flight additions;
it asks per request only while it holds no table younger than ``table_ttl_s``. The routes it makes
go back to every balancer with the next table query, so their measured bucket loads and bands
see every request. ``mode = "ask"``: every request asks.

Metrics (Prometheus text, on the gateway's /metrics):

    dsi_route_total{role, source}           routes by role, source = table | balancer (asked) | local
    dsi_route_table_age_seconds             age of the held decision table (-1: none)
    dsi_route_tables_total                  decision tables taken
    dsi_route_fallbacks_total{reason}       local picks: timeout | lost | no_instance | down | error |
                                            unknown (the route names an instance this gateway cannot use)
    dsi_route_seconds (histogram)           the balancer's answer time, per request (both asks)
    dsi_balancer_bucket_engines{balancer, bucket}, dsi_balancer_bucket_queued_tokens{...},
    dsi_balancer_bucket_share{...}, dsi_balancer_load_spread{balancer, role}
                                            the balancer's view, fetched every ``status_every_s``
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import zmq.asyncio

from dsi.balance.load import NoInstance
from dsi.errors import AskTimeout, DsiError, PeerLost
from dsi.messages import ALL
from dsi.messages.balancer import BalancerState, BalancerStatus, Route, RouteQuery, RouteTable
from dsi.roles.entrypoint.metrics import Histogram
from dsi.roles.entrypoint.route_table import TableRoutes
from dsi.transport.client import Peer, connect_until_up
from dsi.transport.security import CurveKeys

log = logging.getLogger(__name__)

_ROUTE_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05)


@dataclass(slots=True, frozen=True)
class Ask:
    """What the balancer needs to know of a request, in tokens."""

    prompt_tokens: int
    cached_tokens: int  # the predicted prefix hit
    exclude_prefill: Collection[str] = ()
    exclude_decode: Collection[str] = ()


class BalancerRouter:
    """``bound_s``: the longest a request waits for a balancer (seconds); ``mode``: "table" or
    "ask"; ``table_ttl_s`` / ``table_every_s``: how long a table is routed from / how often
    one is asked for (seconds)."""

    def __init__(
        self,
        addresses: Sequence[str],
        ctx: zmq.asyncio.Context,
        *,
        keys: CurveKeys | None = None,
        peer_id: str = "entrypoint",
        bound_s: float = 0.02,
        retry_after_s: float = 1.0,
        status_every_s: float = 1.0,
        mode: str = "table",
        table_ttl_s: float = 0.2,
        table_every_s: float = 0.05,
    ) -> None:
        if mode not in ("table", "ask"):
            raise ValueError(f"route mode must be table or ask, not {mode!r}")
        self.bound_s, self.retry_after_s, self.status_every_s = bound_s, retry_after_s, status_every_s
        self.mode, self.table_every_s = mode, table_every_s
        self.tables = TableRoutes(table_ttl_s)
        self._peers = [
            Peer(a, ctx, types=ALL, peer_id=peer_id, role="entrypoint", keys=keys, timeout=2.0)
            for a in addresses
        ]
        self._down_until = [0.0] * len(self._peers)
        self._tasks: list[asyncio.Task] = []
        self.routes: Counter[tuple[str, str]] = Counter()  # (role, source)
        self.fallbacks: Counter[str] = Counter()
        self.latency = Histogram(buckets=_ROUTE_BUCKETS, counts=[0] * (len(_ROUTE_BUCKETS) + 1))
        self.state: BalancerState | None = None  # the last status fetched

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._connect(p), name=f"balancer {p.address}") for p in self._peers]
        if self._peers:
            self._tasks.append(loop.create_task(self._follow_status(), name="balancer status"))
        if self.mode == "table":
            self._tasks += [
                loop.create_task(self._follow_table(i), name=f"balancer table {p.address}")
                for i, p in enumerate(self._peers)
            ]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for peer in self._peers:
            await peer.close()

    def local(self, role: str, reason: str) -> None:
        """Count a local pick and why."""
        self.routes[(role, "local")] += 1
        self.fallbacks[reason] += 1

    async def route(self, ask: Ask, *, prefill: bool) -> tuple[Route | str, Route | str, str]:
        """(prefill, decode, source): each a Route, or the reason to pick locally
        (``dsi_route_fallbacks_total``); source "table" or "balancer" (asked). ``prefill``: whether
        the request needs a prefill instance at all (else its first is "")."""
        if self.mode == "table":
            held = self.tables.fresh(time.monotonic())
            if held is not None:
                try:
                    pre, dec = self.tables.route(
                        held,
                        ask.prompt_tokens,
                        ask.cached_tokens,
                        ask.exclude_prefill,
                        ask.exclude_decode,
                        prefill,
                    )
                except NoInstance:
                    return ("no_instance" if prefill else ""), "no_instance", "table"
                return pre, dec, "table"
        pre, dec = await self._ask(ask, prefill)
        return pre, dec, "balancer"

    async def _ask(self, ask: Ask, prefill: bool) -> tuple[Route | str, Route | str]:
        index = self._choose()
        if index is None:
            return ("down" if prefill else ""), "down"
        peer = self._peers[index]
        started = time.perf_counter()
        calls = [
            peer.ask(
                RouteQuery(
                    "decode",
                    kv_tokens=ask.prompt_tokens,
                    exclude=sorted(ask.exclude_decode),
                    colocated=not prefill,
                ),
                timeout=self.bound_s,
            )
        ]
        if prefill:
            calls.append(
                peer.ask(
                    RouteQuery(
                        "prefill",
                        uncached_tokens=ask.prompt_tokens - ask.cached_tokens,
                        exclude=sorted(ask.exclude_prefill),
                        cached_tokens=ask.cached_tokens,
                    ),
                    timeout=self.bound_s,
                )
            )
        if prefill:
            answers = await asyncio.gather(*calls, return_exceptions=True)
        else:  # one ask: awaited as it is, without a task around it
            try:
                answers = [await calls[0]]
            except Exception as exc:  # as gather(return_exceptions=True) hands them on
                answers = [exc]
        self.latency.observe(time.perf_counter() - started)
        return (self._take(index, answers[1]) if prefill else ""), self._take(index, answers[0])

    def taken(self, role: str, source: str = "balancer") -> None:
        """Count a route the balancer (or its table) gave and the caller used."""
        self.routes[(role, source)] += 1

    def _choose(self) -> int | None:
        now = time.monotonic()
        for i, peer in enumerate(self._peers):
            if peer.connected and now >= self._down_until[i]:
                return i
        return None

    def _take(self, index: int, answer: object) -> Route | str:
        if isinstance(answer, Route):
            return answer
        address = self._peers[index].address
        if isinstance(answer, (AskTimeout, PeerLost)):  # skip this balancer for a while
            self._down_until[index] = time.monotonic() + self.retry_after_s
            log.warning("balancer %s: %s; routing locally for %gs", address, answer, self.retry_after_s)
            return "timeout" if isinstance(answer, AskTimeout) else "lost"
        if isinstance(answer, DsiError):
            if answer.code != "no_instance":
                log.warning("balancer %s refused a route: %s", address, answer)
            return "no_instance" if answer.code == "no_instance" else "error"
        log.error("balancer %s: unexpected answer %r", address, answer)
        return "error"

    async def _connect(self, peer: Peer) -> None:
        await connect_until_up(peer, "balancer")

    async def _follow_table(self, index: int) -> None:
        """Ask balancer ``index`` for a table every ``table_every_s`` while it is connected."""
        peer = self._peers[index]
        while True:
            if not peer.connected:
                self.tables.forget(index)
            else:
                try:
                    table = await peer.ask(
                        self.tables.query(index), timeout=max(self.tables.ttl_s, self.bound_s)
                    )
                    if isinstance(table, RouteTable):
                        self.tables.take(table, time.monotonic())
                except DsiError as exc:
                    log.info("balancer %s: no table: %s", peer.address, exc)
            await asyncio.sleep(self.table_every_s)

    async def _follow_status(self) -> None:
        while True:
            await asyncio.sleep(self.status_every_s)
            index = self._choose()
            if index is None:
                self.state = None
                continue
            try:
                self.state = await self._peers[index].ask(BalancerStatus(), timeout=self.status_every_s)
            except DsiError as exc:
                log.info("balancer status: %s", exc)

    def metric_lines(self) -> list[str]:
        lines = ["# TYPE dsi_route_total counter"]
        lines += [
            f'dsi_route_total{{role="{r}",source="{s}"}} {n}' for (r, s), n in sorted(self.routes.items())
        ]
        lines.append("# TYPE dsi_route_fallbacks_total counter")
        lines += [f'dsi_route_fallbacks_total{{reason="{r}"}} {n}' for r, n in sorted(self.fallbacks.items())]
        lines += ["# TYPE dsi_route_seconds histogram", *self.latency.lines("dsi_route_seconds")]
        if self.mode == "table":
            lines += [
                "# TYPE dsi_route_table_age_seconds gauge",
                f"dsi_route_table_age_seconds {round(self.tables.age(time.monotonic()), 4)}",
                "# TYPE dsi_route_tables_total counter",
                f"dsi_route_tables_total {self.tables.received}",
            ]
        if self.state is not None:
            lines += state_lines(self.state)
        return lines


def state_lines(state: BalancerState) -> list[str]:
    """A balancer's view in the Prometheus text format."""
    name = state.balancer_id
    out = ["# TYPE dsi_balancer_bucket_engines gauge"]
    out += [
        f'dsi_balancer_bucket_engines{{balancer="{name}",bucket="{b.bucket}"}} {len(b.engines)}'
        for b in state.buckets
    ]
    out.append("# TYPE dsi_balancer_bucket_queued_tokens gauge")
    out += [
        f'dsi_balancer_bucket_queued_tokens{{balancer="{name}",bucket="{b.bucket}"}} {b.queued_tokens}'
        for b in state.buckets
    ]
    out.append("# TYPE dsi_balancer_bucket_share gauge")
    out += [
        f'dsi_balancer_bucket_share{{balancer="{name}",bucket="{b.bucket}"}} {b.share}' for b in state.buckets
    ]
    out.append("# TYPE dsi_balancer_load_spread gauge")
    out += [
        f'dsi_balancer_load_spread{{balancer="{name}",role="{r}"}} {v}'
        for r, v in sorted(state.spread.items())
    ]
    return out
