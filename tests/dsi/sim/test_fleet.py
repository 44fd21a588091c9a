"""Fleets: the instances behind the autoscaler's counts move as the counts do."""

from __future__ import annotations

from dsi.autoscale import RoleBounds
from dsi.autoscale.decision import RoleDecision
from dsi.engine.hit_policy import NO_HIT
from dsi.sim.fleet import Fleet
from dsi.sim.prefill import PrefillInstance, PrefillJob


def _states(fleet: Fleet) -> dict[str, str]:
    return {m.id: m.state for m in fleet.members}


def test_moves_follow_the_decision_and_the_counts_agree():
    fleet = Fleet.scaled("p", PrefillInstance, RoleBounds(min_instances=2, max_instances=6, ready_pool=1))
    assert _states(fleet) == {"p0000": "serving", "p0001": "serving", "p0002": "ready"}
    fleet.apply(RoleDecision(need=4, target=4, take_from_pool=1, start=2), now=0.0, start_s=60.0)
    assert fleet.census() == (3, 0, 2) and len(fleet.serving()) == 3
    fleet.arrive(59.0)
    assert fleet.census() == (3, 0, 2)
    fleet.arrive(60.0)
    assert fleet.census() == (3, 2, 0) and list(_states(fleet).values()).count("ready") == 2


def test_a_busy_instance_leaving_service_finishes_first_and_the_least_busy_leaves_first():
    fleet = Fleet.fixed("p", PrefillInstance, 2)
    busy = fleet.members[1].engine
    assert isinstance(busy, PrefillInstance)
    busy.add(PrefillJob(0, 100, NO_HIT, 10.0, 1.0), now=0.0)
    fleet.apply(RoleDecision(need=0, target=0, stop_serving=2), now=1.0, start_s=0.0)
    assert _states(fleet) == {"p0000": "gone", "p0001": "stopping"}
    busy.finish()
    fleet.settle(10.0)
    assert _states(fleet)["p0001"] == "gone"
    hours = fleet.hours(20.0)
    assert hours["instance_hours"] == round(11.0 / 3600, 4) and hours["busy_hours"] == round(10.0 / 3600, 4)
