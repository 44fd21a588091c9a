"""Vision balancer: least queued pixels among serving encoders."""

import pytest

from dsi.balance import InstanceLoad, NoInstance, route_vision


def _e(name, pixels=0, running=0, state="serving"):
    return InstanceLoad(id=name, role="encoder", queued_pixels=pixels, running_requests=running, state=state)


def test_least_queued_pixels_then_fewer_requests_then_id():
    pool = [
        _e("e0", 3_000_000),
        _e("e1", 1_000_000, 4),
        _e("e2", 1_000_000, 2),
        _e("e3", 0, state="draining"),
    ]
    d = route_vision(786_432, pool)
    assert (d.instance, d.queued_pixels) == ("e2", 1_000_000)
    assert route_vision(1, [_e("e1"), _e("e0")]).instance == "e0"


def test_only_serving_encoders_and_real_images():
    prefill = InstanceLoad(id="p0", role="prefill")
    with pytest.raises(NoInstance, match="encoder"):
        route_vision(1_000, [_e("e0", state="draining"), prefill])
    with pytest.raises(ValueError, match="pixel"):
        route_vision(0, [_e("e0")])
