"""LoadTable: a balancer's view of the engines, from their pushed reports and the controller.

An instance is routed to only when both sources agree it can work:

    controller (ListInstances, every refresh)  serving | draining | (anything else: not listed)
    engine (LoadReport, pushed)                 a report younger than ``report_timeout_s``

An instance the controller's table leaves out keeps the state it was last listed in for
``unlisted_grace_s``: a restarted controller lists the instances only as their heartbeats reach
it (within a heartbeat interval or two), and a table taken meanwhile would otherwise leave a few
instances to take every request. A stopped or dead instance is listed as such, and a vanished
one stops reporting (stale after ``report_timeout_s``), so neither is routed to meanwhile.

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
    missing_since: float | None = None  # monotonic seconds since when the controller does not list it
    pending: deque[Pending] = field(default_factory=deque)
    # load() as of the last change of the report, the state or the pending requests; every
    # table and route reads it, far more often than one instance's load changes.
    cached: InstanceLoad | None = None
    changed: bool = True

    def current(self, instance_id: str, role: str) -> InstanceLoad | None:
        """``load``, computed again only after a change (the caller sets ``changed``)."""
        if self.changed:
            self.cached, self.changed = self.load(instance_id, role), False
        return self.cached

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
            queued_tokens=r.queued_tokens + extra,  # counts for colocated requests only
            running_requests=requests,
            kv_tokens=r.kv_tokens + extra,
            max_requests=r.max_requests,
            kv_capacity_tokens=r.kv_capacity_tokens,
        )


class LoadTable:
    """``report_timeout_s``: a report older than this (seconds) makes the instance stale (not
    routed to); ``pending_ttl_s``: how long a routed request counts before the engine's report
    must show it; ``unlisted_grace_s``: how long an instance the controller stopped listing
    keeps its last listed state (seconds)."""

    def __init__(
        self, report_timeout_s: float = 3.0, pending_ttl_s: float = 2.0, unlisted_grace_s: float = 10.0
    ) -> None:
        self.report_timeout_s = report_timeout_s
        self.pending_ttl_s = pending_ttl_s
        self.unlisted_grace_s = unlisted_grace_s
        self._known: dict[str, Known] = {}
        self._ids: list[str] | None = []  # the known ids, sorted (None: to sort again)

    def report(self, r: LoadReport, now: float) -> None:
        known = self._entry(r.instance_id)
        old = known.report
        if old is None or old.started_at != r.started_at or r.accepted < old.accepted:
            known.pending.clear()  # a new run of the instance: nothing routed before counts
        else:
            for _ in range(min(r.accepted - old.accepted, len(known.pending))):
                known.pending.popleft()
        known.report, known.received, known.changed = r, now, True

    def listed(self, instances: list[InstanceInfo], now: float) -> None:
        """The controller's table of engine instances: their states and addresses. One it leaves
        out keeps its last state for ``unlisted_grace_s``, then is not listed ("")."""
        seen = set()
        for info in instances:
            if info.role not in ("prefill", "decode"):
                continue
            seen.add(info.instance_id)
            known = self._entry(info.instance_id)
            known.changed |= known.state != info.state
            known.state, known.address, known.missing_since = info.state, info.address, None
        for instance_id, known in list(self._known.items()):
            if instance_id in seen:
                continue
            if known.report is None:
                del self._known[instance_id]
                self._ids = None
            elif known.missing_since is None:
                known.missing_since = now
            elif now - known.missing_since > self.unlisted_grace_s and known.state:
                known.state, known.changed = "", True

    def routed(self, instance_id: str, tokens: int, now: float) -> None:
        known = self._known[instance_id]
        known.pending.append(Pending(now, tokens))
        known.changed = True

    def knows(self, instance_id: str) -> bool:
        return instance_id in self._known

    def address(self, instance_id: str) -> str:
        return self._known[instance_id].address

    def snapshot(self, role: str, now: float) -> list[InstanceLoad]:
        """The instances of ``role`` a policy may see (serving, or draining), ordered by id."""
        out = []
        for instance_id in self._sorted_ids():
            known = self._known[instance_id]
            self._expire(known, now)
            if known.report is None or known.report.role != role or self._stale(known, now):
                continue
            load = known.current(instance_id, role)
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

    def _entry(self, instance_id: str) -> Known:
        known = self._known.get(instance_id)
        if known is None:
            known = self._known[instance_id] = Known()
            self._ids = None
        return known

    def _sorted_ids(self) -> list[str]:
        if self._ids is None:
            self._ids = sorted(self._known)
        return self._ids

    def _stale(self, known: Known, now: float) -> bool:
        return now - known.received > self.report_timeout_s

    def _expire(self, known: Known, now: float) -> None:
        while known.pending and now - known.pending[0].at > self.pending_ttl_s:
            known.pending.popleft()
            known.changed = True
