"""TableRoutes: an entrypoint's decision table (dsi.balance.table), taken from the balancers.

    every ``every_s``, to each connected balancer: TableQuery(routed since the last query, upto)
                                            <-- RouteTable
    per request, while the held table is younger than ``ttl_s``: route from it locally

The held table is the freshest one (latest ``made_at``) of any balancer. Each route made from a
table gets a sequence number and is (a) queued for every connected balancer's next query, so
their measured bucket loads and bands see the whole stream, and (b) added to the in-flight
loads the next routes see. A table whose ``acked`` covers a route counts it in its loads
(pending on the balancer), so that route leaves the in-flight additions when the table arrives.

No I/O here: the router (dsi.roles.entrypoint.router) sends the queries and passes ``now``
(monotonic seconds).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from dsi.balance import InstanceLoad
from dsi.balance.decode import DecodeBands
from dsi.balance.table import DecisionTable, InFlight, decode_from_table, prefill_from_table
from dsi.messages.balancer import Route, RoutedRequest, RouteTable, TableQuery

MAX_QUEUED = 4096  # routed requests kept for one balancer's next query (older ones are dropped)


def decision_table(t: RouteTable) -> DecisionTable:
    """The pure table of a balancer's RouteTable."""
    return DecisionTable(
        edges=tuple(t.edges),
        buckets=tuple(tuple(b) for b in t.buckets),
        prefills=tuple(
            InstanceLoad(
                id=e.instance_id, role="prefill", queued_tokens=e.queued_tokens, running_requests=e.running
            )
            for e in t.prefills
        ),
        decodes=tuple(
            InstanceLoad(
                id=e.instance_id,
                role="decode",
                queued_tokens=e.queued_tokens,
                running_requests=e.running,
                kv_tokens=e.kv_tokens,
                max_requests=e.max_requests,
                kv_capacity_tokens=e.kv_capacity_tokens,
            )
            for e in t.decodes
        ),
        bands=DecodeBands(t.long_threshold or None, tuple(t.long_band), 0.0),
        overload=t.overload,
    )


@dataclass(slots=True)
class Held:
    source: RouteTable
    table: DecisionTable
    addresses: dict[str, str]  # instance id -> control-plane endpoint
    received: float  # monotonic seconds


@dataclass(slots=True)
class TableRoutes:
    """``ttl_s``: how long (seconds from arrival) a table is routed from."""

    ttl_s: float
    held: Held | None = None
    inflight: InFlight = field(default_factory=InFlight)
    received: int = 0  # tables taken
    _seq: int = 0
    _added: deque[tuple[int, str, int]] = field(default_factory=deque)  # (seq, instance, tokens)
    _queued: dict[int, list[RoutedRequest]] = field(default_factory=dict)  # [balancer index] -> routes

    def fresh(self, now: float) -> Held | None:
        held = self.held
        return held if held is not None and now - held.received < self.ttl_s else None

    def age(self, now: float) -> float:
        """Seconds since the held table arrived (-1: none)."""
        return now - self.held.received if self.held is not None else -1.0

    def query(self, index: int) -> TableQuery:
        """The next query to balancer ``index`` (connected): what was routed since its last one."""
        routed = self._queued.get(index)
        self._queued[index] = []
        return TableQuery(routed or [], self._seq)

    def forget(self, index: int) -> None:
        """Balancer ``index`` is not connected: queue nothing for it until it is asked again."""
        self._queued.pop(index, None)

    def take(self, t: RouteTable, now: float) -> bool:
        """Hold ``t`` if it is at least as fresh as the held one (or that one is stale)."""
        held = self.fresh(now)
        if held is not None and t.made_at < held.source.made_at:
            return False
        addresses = {e.instance_id: e.address for e in t.prefills}
        addresses.update((e.instance_id, e.address) for e in t.decodes)
        self.held = Held(t, decision_table(t), addresses, now)
        self.received += 1
        added = self._added
        while added and added[0][0] <= t.acked:
            _, instance, tokens = added.popleft()
            self.inflight.remove(instance, tokens)
        return True

    def route(
        self,
        held: Held,
        prompt_tokens: int,
        cached_tokens: int,
        exclude_prefill,
        exclude_decode,
        prefill: bool,
    ) -> tuple[Route | str, Route]:
        """(prefill, decode) from ``held``; the prefill is "" when not asked for. Raises NoInstance."""
        table = held.table
        decision = decode_from_table(
            table, prompt_tokens, self.inflight, exclude_decode, colocated=not prefill
        )
        pre: Route | str = ""
        if prefill:
            uncached = max(1, prompt_tokens - cached_tokens)
            instance, bucket = prefill_from_table(table, uncached, self.inflight, exclude_prefill)
            self._add("prefill", instance, uncached, cached_tokens)
            pre = Route(instance, held.addresses[instance], bucket)
        self._add("decode", decision.instance, max(1, prompt_tokens), 0)
        return pre, Route(decision.instance, held.addresses[decision.instance], band=decision.band)

    def _add(self, role: str, instance: str, tokens: int, cached: int) -> None:
        self._seq += 1
        self.inflight.add(instance, tokens)
        self._added.append((self._seq, instance, tokens))
        r = RoutedRequest(role, instance, tokens, cached)
        for queued in self._queued.values():
            if len(queued) < MAX_QUEUED:
                queued.append(r)
