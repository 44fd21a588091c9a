"""LoadTable: reports and the controller's states decide who is routable; pending routes count
until the engine's accepted counter shows them."""

from dsi.roles.balancer.loads import LoadTable
from tests.roles.balancer.helpers import decode, prefill, table


def _table() -> LoadTable:
    t = LoadTable(report_timeout_s=3.0, pending_ttl_s=2.0)
    t.listed(
        table(
            **{"prefill-0": "serving", "prefill-1": "draining", "prefill-2": "dead", "decode-0": "serving"}
        ).instances,
        now=0.0,
    )
    return t


def test_only_listed_instances_with_a_fresh_report_are_seen_and_draining_stays_draining():
    t = _table()
    for i in range(3):
        t.report(prefill(f"prefill-{i}", 100 * i), now=0.0)
    t.report(prefill("prefill-9"), now=0.0)  # reports, but the controller does not list it
    seen = {e.id: e.state for e in t.snapshot("prefill", now=1.0)}
    assert seen == {"prefill-0": "serving", "prefill-1": "draining"}  # dead and unlisted: gone
    assert t.snapshot("prefill", now=3.5) == []  # every report older than 3 s: stale
    assert [v.state for v in t.views(3.5) if v.instance_id.startswith("prefill")] == ["stale"] * 4
    t.report(prefill("prefill-0", state="stopping"), now=4.0)  # the process is stopping: no new work
    assert [e.state for e in t.snapshot("prefill", now=4.0)] == ["draining"]


def test_pending_routes_count_until_the_engine_accepts_them():
    t = _table()
    t.report(prefill("prefill-0", 1_000, accepted=5), now=0.0)
    t.routed("prefill-0", 300, now=0.1)
    t.routed("prefill-0", 200, now=0.2)
    [p] = t.snapshot("prefill", now=0.3)
    assert (p.queued_tokens, p.running_requests) == (1_500, 2)
    t.report(prefill("prefill-0", 1_300, accepted=6), now=0.4)  # the first one arrived
    [p] = t.snapshot("prefill", now=0.4)
    assert (p.queued_tokens, p.running_requests) == (1_500, 1)
    [p] = t.snapshot("prefill", now=2.3)  # the second never arrives: it retires after 2 s
    assert (p.queued_tokens, p.running_requests) == (1_300, 0)
    t.routed("prefill-0", 50, now=2.4)
    t.report(prefill("prefill-0", 0, accepted=0, started_at=2.0), now=2.5)  # restarted: a new run
    [p] = t.snapshot("prefill", now=2.5)
    assert (p.queued_tokens, p.running_requests) == (0, 0)


def test_a_decode_counts_requests_and_kv_with_its_capacity():
    t = _table()
    t.report(decode("decode-0", running=3, kv=4_000, capacity=50_000), now=0.0)
    t.routed("decode-0", 700, now=0.1)
    [d] = t.snapshot("decode", now=0.1)
    assert (d.running_requests, d.kv_tokens, d.max_requests, d.kv_capacity_tokens) == (4, 4_700, 64, 50_000)
    t.report(decode("decode-0", capacity=0), now=0.2)  # no capacity said: cannot be scored
    assert t.snapshot("decode", now=0.2) == []


def test_an_instance_the_controller_drops_keeps_its_state_for_the_grace_period_then_is_not_routable():
    t = LoadTable(report_timeout_s=30.0, unlisted_grace_s=10.0)
    t.listed(table(**{"prefill-0": "serving", "prefill-1": "serving"}).instances, now=0.0)
    t.report(prefill("prefill-0"), now=0.0)
    t.report(prefill("prefill-1"), now=0.0)
    # A restarted controller that has heard prefill-1's heartbeat but not prefill-0's yet.
    t.listed(table(**{"prefill-1": "serving"}).instances, now=1.0)
    assert [e.id for e in t.snapshot("prefill", now=1.0)] == ["prefill-0", "prefill-1"]
    t.listed(table(**{"prefill-1": "serving"}).instances, now=10.9)
    assert [e.id for e in t.snapshot("prefill", now=10.9)] == ["prefill-0", "prefill-1"]
    t.listed(table(**{"prefill-1": "serving"}).instances, now=11.1)  # unlisted for over 10 s
    assert [e.id for e in t.snapshot("prefill", now=11.1)] == ["prefill-1"]
    assert [v.state for v in t.views(11.1) if v.instance_id == "prefill-0"] == ["unlisted"]
    t.listed(table(**{"prefill-0": "draining", "prefill-1": "serving"}).instances, now=12.0)  # heard again
    assert [e.state for e in t.snapshot("prefill", now=12.0)] == ["draining", "serving"]


def test_an_instance_listed_dead_is_not_routable_at_once_grace_or_not():
    t = _table()
    t.report(prefill("prefill-0"), now=0.0)
    t.listed(table(**{"prefill-0": "dead"}).instances, now=0.1)
    assert t.snapshot("prefill", now=0.1) == []


def test_a_snapshot_shows_every_change_at_once_and_reuses_an_unchanged_load():
    t = _table()
    t.report(prefill("prefill-0", 100), now=0.0)
    [first] = t.snapshot("prefill", now=0.1)
    [again] = t.snapshot("prefill", now=0.2)
    assert again is first  # nothing changed: the load is not built again
    t.routed("prefill-0", 50, now=0.3)
    assert t.snapshot("prefill", now=0.3)[0].queued_tokens == 150
    assert t.snapshot("prefill", now=2.4)[0].queued_tokens == 100  # the route retired after 2 s
    t.listed(table(**{"prefill-0": "draining"}).instances, now=2.5)
    assert [e.state for e in t.snapshot("prefill", now=2.5)] == ["draining"]
    t.report(prefill("prefill-0", 700), now=2.6)
    assert t.snapshot("prefill", now=2.6)[0].queued_tokens == 700
    t.report(prefill("prefill-00"), now=2.7)  # a new id joins the order
    t.listed(table(**{"prefill-0": "serving", "prefill-00": "serving"}).instances, now=2.7)
    assert [e.id for e in t.snapshot("prefill", now=2.7)] == ["prefill-0", "prefill-00"]
