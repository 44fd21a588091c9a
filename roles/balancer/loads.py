"""LoadTable: a balancer's view of the engines, from their pushed reports and the controller.

An instance is routed to only when both sources agree it can work:

    controller (ListInstances, every refresh)  serving | draining | (anything else: not listed)
    engine (LoadReport, pushed)                 a report younger than ``report_timeout_s``

Between a route and the report that shows it, the request is *pending* here: it adds to the
instance's queue (prefill: its un-cached tokens; decode: its KV tokens and one request). An
engine counts the requests it accepted (``LoadReport.accepted``); each report retires that many
of the oldest pending requests, since the engine's own counts now hold them. A pending request
the engine never accepts (it failed on the way) retires after ``pending_ttl_s``.

No I/O and no clock of its own: the caller passes ``now`` (monotonic seconds).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from dsi.balance import InstanceLoad
from dsi.messages.balancer import InstanceView, LoadReport
from dsi.messages.control import InstanceInfo

ROUTABLE = ("serving", "draining")  # controller states a balancer knows what to do with


@dataclass(slots=True, frozen=True)
class Pending:
    at: float  # monotonic seconds when it was routed
    tokens: int  # prefill: un-cached tokens; decode: KV tokens


@dataclass(slots=True)
class Known:
    """One engine instance as the table holds it."""

    report: LoadReport | None = None
    received: float = 0.0  # monotonic seconds of the last report
    state: str = ""  # lifecycle state from the controller ("" = not listed)
    address: str = ""  # control-plane endpoint, from the controller
    pending: deque[Pending] = field(default_factory=deque)

    def load(self, instance_id: str, role: str) -> InstanceLoad | None:
        """The policy's snapshot (reported + pending), or None when it cannot take work."""
        r = self.report
        if r is None or self.state not in ROUTABLE:
            return None
        state = "serving" if self.state == "serving" and r.state == "ready" else "draining"
        extra = sum(p.tokens for p in self.pending)
        requests = r.running + r.waiting + len(self.pending)
        if role == "prefill":
            return InstanceLoad(
                id=instance_id,
                role="prefill",
                state=state,
                queued_tokens=r.queued_tokens + extra,
                running_requests=requests,
            )
        if r.max_requests <= 0 or r.kv_capacity_tokens <= 0:
            return None  # a decode that does not say its capacity cannot be scored
        return InstanceLoad(
            id=instance_id,
            role="decode",
            state=state,
            running_requests=requests,
            kv_tokens=r.kv_tokens + extra,
            max_requests=r.max_requests,
            kv_capacity_tokens=r.kv_capacity_tokens,
        )


class LoadTable:
    """``report_timeout_s``: a report older than this (seconds) makes the instance stale (not
    routed to); ``pending_ttl_s``: how long a routed request counts before the engine's report
    must show it."""

    def __init__(self, report_timeout_s: float = 3.0, pending_ttl_s: float = 2.0) -> None:
        self.report_timeout_s = report_timeout_s
        self.pending_ttl_s = pending_ttl_s
        self._known: dict[str, Known] = {}

    def report(self, r: LoadReport, now: float) -> None:
        known = self._known.setdefault(r.instance_id, Known())
        old = known.report
        if old is None or old.started_at != r.started_at or r.accepted < old.accepted:
            known.pending.clear()  # a new run of the instance: nothing routed before counts
        else:
            for _ in range(min(r.accepted - old.accepted, len(known.pending))):
                known.pending.popleft()
        known.report, known.received = r, now

    def listed(self, instances: list[InstanceInfo]) -> None:
        """The controller's table of engine instances: their states and addresses."""
        seen = set()
        for info in instances:
            if info.role not in ("prefill", "decode"):
                continue
            seen.add(info.instance_id)
            known = self._known.setdefault(info.instance_id, Known())
            known.state, known.address = info.state, info.address
        for instance_id, known in list(self._known.items()):
            if instance_id not in seen:
                if known.report is None:
                    del self._known[instance_id]
                else:
                    known.state = ""

    def routed(self, instance_id: str, tokens: int, now: float) -> None:
        self._known[instance_id].pending.append(Pending(now, tokens))

    def knows(self, instance_id: str) -> bool:
        return instance_id in self._known

    def address(self, instance_id: str) -> str:
        return self._known[instance_id].address

    def snapshot(self, role: str, now: float) -> list[InstanceLoad]:
        """The instances of ``role`` a policy may see (serving, or draining), ordered by id."""
        out = []
        for instance_id, known in sorted(self._known.items()):
            self._expire(known, now)
            if known.report is None or known.report.role != role or self._stale(known, now):
                continue
            load = known.load(instance_id, role)
            if load is not None:
                out.append(load)
        return out

    def views(self, now: float) -> list[InstanceView]:
        """Every instance the table knows, for ``dsi status``."""
        out = []
        for instance_id, known in sorted(self._known.items()):
            r = known.report
            state = known.state or "unlisted"
            if r is not None and self._stale(known, now):
                state = "stale"
            out.append(
                InstanceView(
                    instance_id,
                    r.role if r is not None else "",
                    state,
                    (r.queued_tokens if r is not None else 0) + sum(p.tokens for p in known.pending),
                    r.running + r.waiting if r is not None else 0,
                    r.kv_tokens if r is not None else 0,
                    round(now - known.received, 3) if r is not None else -1.0,
                )
            )
        return out

    def _stale(self, known: Known, now: float) -> bool:
        return now - known.received > self.report_timeout_s

    def _expire(self, known: Known, now: float) -> None:
        while known.pending and now - known.pending[0].at > self.pending_ttl_s:
            known.pending.popleft()
