"""TableRoutes: the freshest table is held, in-flight additions leave once a table counts them,
and routes are queued for every connected balancer."""

from dsi.messages.balancer import RouteTable, TableEntry
from dsi.roles.entrypoint.route_table import TableRoutes


def _table(made_at: float, acked: int, d0_running: int = 0, name: str = "balancer-0") -> RouteTable:
    decodes = [
        TableEntry(i, f"tcp://{i}", running=r, max_requests=8, kv_capacity_tokens=100_000)
        for i, r in (("d0", d0_running), ("d1", 0))
    ]
    return RouteTable(
        name, 1.0, 1, made_at, acked, [16_384], [["p0"], ["p0"]], [TableEntry("p0", "tcp://p0")], decodes
    )


def test_in_flight_additions_spread_a_burst_and_leave_when_a_table_counts_them():
    routes = TableRoutes(ttl_s=0.2)
    assert routes.fresh(0.0) is None and routes.age(0.0) == -1.0
    routes.query(0)  # balancer 0 is connected
    assert routes.take(_table(100.0, 0), now=1.0)
    held = routes.fresh(1.1)
    picks = [routes.route(held, 1_000, 0, (), (), prefill=False)[1].instance_id for _ in range(3)]
    assert picks == ["d0", "d1", "d0"]
    q = routes.query(0)
    assert (q.upto, [r.instance_id for r in q.routed]) == (3, ["d0", "d1", "d0"])
    routes.route(held, 1_000, 0, (), (), prefill=False)  # seq 4: after the query, not counted yet
    assert routes.take(_table(100.1, 3, d0_running=2), now=1.15)
    assert routes.inflight.requests == {"d1": 1}
    assert routes.fresh(1.4) is None  # older than ttl_s


def test_the_freshest_table_of_several_balancers_is_held():
    routes = TableRoutes(ttl_s=0.2)
    assert routes.take(_table(100.2, 0, name="balancer-1"), now=1.0)
    assert not routes.take(_table(100.1, 0, name="balancer-0"), now=1.01)  # made earlier
    assert routes.held.source.balancer_id == "balancer-1"
    assert routes.take(_table(100.1, 0, name="balancer-0"), now=1.5)  # the held one went stale
    assert routes.held.source.balancer_id == "balancer-0" and routes.received == 2
