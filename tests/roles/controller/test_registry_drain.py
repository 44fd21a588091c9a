"""Drain orders in the registry: draining with a grace deadline, undrain only within it."""

import pytest

from dsi.errors import InvalidRequest
from dsi.roles.controller.lifecycle import IllegalTransition
from dsi.roles.controller.registry import InstanceRegistry
from tests.roles.controller.test_registry import beat, moves


@pytest.fixture
def reg() -> InstanceRegistry:
    r = InstanceRegistry(1.0, 5.0, forget_after_s=30.0)
    r.heartbeat(beat("decode-0", role="decode"), now=0.0)
    return r


def test_a_drain_order_makes_draining_and_an_undrain_in_the_grace_period_serving_again(reg):
    assert moves(reg.drain("decode-0", 2.0, now=10.0)) == [("decode-0", "serving", "draining")]
    assert reg.in_grace("decode-0", 11.9) and not reg.in_grace("decode-0", 12.0)
    assert reg.drain("decode-0", 60.0, now=11.0) == []  # a second order keeps the first deadline
    assert not reg.in_grace("decode-0", 12.5)
    reg.heartbeat(beat("decode-0", role="decode"), now=11.5)  # beats do not end a drain
    assert reg.state("decode-0") == "draining"
    assert moves(reg.undrain("decode-0", now=11.9)) == [("decode-0", "draining", "serving")]
    assert not reg.in_grace("decode-0", 11.9)
    counts = {(c.before, c.after): c.count for c in reg.transition_counts()}
    assert counts[("draining", "serving")] == 1


def test_undrain_after_the_grace_period_or_without_an_order_is_refused(reg):
    with pytest.raises(IllegalTransition, match="not draining"):
        reg.undrain("decode-0", now=1.0)
    reg.set_state("decode-0", "draining", now=1.0, reason="operator")  # no drain order: no grace period
    with pytest.raises(IllegalTransition, match="not draining by a drain order"):
        reg.undrain("decode-0", now=1.5)
    reg.drain("decode-0", 2.0, now=2.0)  # an order for a draining instance sets its deadline
    with pytest.raises(IllegalTransition, match="grace period ended"):
        reg.undrain("decode-0", now=4.0)
    assert reg.state("decode-0") == "draining"


def test_bad_drain_orders_are_refused_and_change_nothing(reg):
    with pytest.raises(InvalidRequest, match="unknown instance"):
        reg.drain("decode-9", 1.0, now=1.0)
    with pytest.raises(InvalidRequest, match="grace_s"):
        reg.drain("decode-0", -1.0, now=1.0)
    with pytest.raises(InvalidRequest, match="unknown instance"):
        reg.undrain("decode-9", now=1.0)
    reg.goodbye("decode-0", now=2.0)
    with pytest.raises(IllegalTransition):
        reg.drain("decode-0", 1.0, now=3.0)
    assert reg.state("decode-0") == "stopped"
