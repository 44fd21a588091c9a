"""A balancer's decision tables (dsi.balance.table) on the wire: what an entrypoint routed from
its last table is measured and made pending here, then the next table is made.

A routed request counts as a RouteQuery's would: a prefill's FLOPs join its bucket's measured
load, a decode's KV length joins the recent lengths the bands follow, and both are pending on
their instance until its report shows them (LoadTable). A route to an instance the table does
not know (it went away) is measured but not made pending.
"""

from __future__ import annotations

import time

from dsi.balance.load import serving
from dsi.messages.balancer import RoutedRequest, RouteTable, TableEntry
from dsi.roles.balancer.loads import LoadTable
from dsi.roles.balancer.policies import Policies


def measure_routed(policies: Policies, table: LoadTable, r: RoutedRequest, now: float) -> bool:
    """Count one routed request; False (ignored) for a role or counts that make no sense."""
    if r.tokens < 0 or r.cached_tokens < 0:
        return False
    if r.role == "prefill":
        tokens = max(1, r.tokens)
        policies.prefill.observe(tokens, r.cached_tokens, now)
    elif r.role == "decode":
        tokens = max(1, r.tokens)
        policies.decode.observe(tokens)
    else:
        return False
    if table.knows(r.instance_id):
        table.routed(r.instance_id, tokens, now)
    return True


def make_table(
    name: str,
    epoch: float,
    version: int,
    acked: int,
    policies: Policies,
    table: LoadTable,
    now: float,
    replan: frozenset[str] = frozenset({"prefill", "decode"}),
) -> RouteTable:
    """The table of serving instances now; ``now`` monotonic seconds. The plan of a role in
    ``replan`` (one whose requests were just measured) is checked as a RouteQuery would; the
    other keeps its plan, so an instance's brief absence between routes moves nothing (as with
    RouteQuery, whose plans are checked only when a request is routed)."""
    prefills = serving(table.snapshot("prefill", now), "prefill")
    decodes = serving(table.snapshot("decode", now), "decode")
    cfg = policies.prefill.cfg
    plan = policies.prefill.plan
    if "prefill" in replan or plan is None:
        plan = policies.prefill.plan_for(prefills, now)
    ids = [e.id for e in prefills]
    buckets = [list(plan.engines_for(b)) if plan is not None else ids for b in range(cfg.buckets)]
    bands = policies.decode.plan_for(decodes) if "decode" in replan else policies.decode.bands
    return RouteTable(
        name,
        epoch,
        version,
        time.time(),
        acked,
        list(cfg.edges),
        buckets,
        [TableEntry(e.id, table.address(e.id), e.queued_tokens, e.running_requests) for e in prefills],
        [
            TableEntry(
                i.id,
                table.address(i.id),
                i.queued_tokens,
                i.running_requests,
                i.kv_tokens,
                i.max_requests,
                i.kv_capacity_tokens,
            )
            for i in decodes
        ],
        list(bands.long),
        bands.threshold or 0,
        policies.decode.cfg.overload,
    )
