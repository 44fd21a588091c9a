"""Balancer channel: engines push their load, the entrypoint asks where a request goes.

    prefill / decode --LoadReport (tell; every interval and on change)--> every balancer
    entrypoint --RouteQuery (ask, bounded)--> one balancer --Route | NoInstance
    entrypoint --TableQuery (ask, every few tens of ms; what it routed since)--> every balancer
               --RouteTable (the plan and loads to route from until the next one)
    dsi status --BalancerStatus (ask)--> balancer --BalancerState

A balancer routes only to instances that the controller lists as ``serving`` and that sent a
report lately; a request's ``exclude`` (instances that already failed it) is never chosen.
"""

from __future__ import annotations

from dsi.messages.base import Message


class RouteQuery(Message):
    role: str  # prefill | decode
    uncached_tokens: int = 0  # prefill: prompt tokens to compute (the prompt less its predicted hit)
    kv_tokens: int = 0  # decode: KV tokens the request holds when it arrives (its prompt)
    exclude: list[str] = []  # instance ids that already failed this request
    cached_tokens: int = 0  # prefill: the predicted prefix hit, tokens (for the FLOP estimate)
    colocated: bool = False  # decode: no prefill instance; the decode computes the prompt itself


class Route(Message):
    instance_id: str
    address: str  # the instance's control-plane endpoint
    bucket: int = -1  # prefill: the length bucket of the request
    band: str = ""  # decode: long | short | one


class LoadReport(Message):
    """Engine -> balancer (tell): what the instance holds now. Counts, not rates."""

    instance_id: str
    role: str  # prefill | decode
    started_at: float  # unix seconds; a restarted instance reports a new value
    state: str = "ready"  # the process's own state: starting | ready | stopping
    queued_tokens: int = 0  # prompt tokens accepted, not yet computed (prefill; colocated decode)
    running: int = 0  # requests it holds
    waiting: int = 0  # requests queued for admission
    kv_tokens: int = 0  # KV tokens its running requests hold
    max_requests: int = 0  # decode capacity: requests it can batch
    kv_capacity_tokens: int = 0  # decode capacity: KV tokens it can hold
    accepted: int = 0  # requests it has accepted since it started (a counter)


class BalancerStatus(Message):
    """Operator -> balancer: its view (answered with BalancerState)."""


class BucketInfo(Message):
    bucket: int
    min_tokens: int  # un-cached tokens, inclusive
    max_tokens: int  # exclusive; 0 = no upper bound
    share: float  # measured compute share (0..1)
    engines: list[str]  # the prefill instances that serve it
    queued_tokens: int  # un-cached tokens queued on those engines


class InstanceView(Message):
    instance_id: str
    role: str
    state: str  # serving | draining | stale (no recent report) | <controller state>
    queued_tokens: int
    running: int
    kv_tokens: int
    report_age_s: float  # seconds since its last report (-1: none)


class BalancerState(Message):
    balancer_id: str
    buckets: list[BucketInfo]
    long_band: list[str]  # decode instances of the long band (empty: one band)
    long_threshold: int  # KV tokens where the long band starts (0: one band)
    instances: list[InstanceView]
    routed: dict[str, int] = {}  # requests routed per role since start
    spread: dict[str, float] = {}  # per role: max / mean load over serving instances (1.0 = even)


class RoutedRequest(Message):
    """A request a router placed from a table, for the balancer's measured loads and pending."""

    role: str  # prefill | decode
    instance_id: str
    tokens: int  # prefill: un-cached tokens; decode: KV tokens
    cached_tokens: int = 0  # prefill: the predicted prefix hit (for the FLOP estimate)


class TableQuery(Message):
    """Entrypoint -> balancer: the requests it routed from tables since its last query (each
    sequence number up to ``upto`` is in ``routed`` or an earlier query); answered with RouteTable."""

    routed: list[RoutedRequest] = []
    upto: int = 0


class TableEntry(Message):
    instance_id: str
    address: str  # control-plane endpoint
    queued_tokens: int = 0  # un-cached tokens queued (reported + pending; decode: colocated runs)
    running: int = 0  # requests it holds (reported + pending)
    kv_tokens: int = 0  # decode
    max_requests: int = 0  # decode capacity
    kv_capacity_tokens: int = 0  # decode capacity


class RouteTable(Message):
    """Balancer -> entrypoint: the decision table (see dsi.balance.table); serving instances only."""

    balancer_id: str
    epoch: float  # unix seconds the balancer started (a restarted balancer has a new one)
    version: int  # tables made by this balancer since it started
    made_at: float  # unix seconds
    acked: int  # the query's ``upto``: the asker's routes up to it are counted in the loads
    edges: list[int]  # un-cached tokens where prefill buckets 1.. start
    buckets: list[list[str]]  # [bucket] prefill ids
    prefills: list[TableEntry]
    decodes: list[TableEntry]
    long_band: list[str] = []  # decode ids of the long band (empty: one band)
    long_threshold: int = 0  # KV tokens where long starts (0: one band)
    overload: float = 0.9  # decode score above which an instance with >= 2 requests is overloaded
    build_s: float = 0.0  # seconds the balancer took to make it (routed requests measured, plans checked)


BalancerMsg = (
    RouteQuery
    | Route
    | LoadReport
    | BalancerStatus
    | BucketInfo
    | InstanceView
    | BalancerState
    | RoutedRequest
    | TableQuery
    | TableEntry
    | RouteTable
)
BALANCER = (
    RouteQuery,
    Route,
    LoadReport,
    BalancerStatus,
    BucketInfo,
    InstanceView,
    BalancerState,
    RoutedRequest,
    TableQuery,
    TableEntry,
    RouteTable,
)
