"""The simulation config refuses what it cannot honour, naming the field."""

from __future__ import annotations

import pytest

from dsi.autoscale import AutoscalerConfig, RoleBounds
from dsi.sim.config import SimConfig


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"prefill_lb": "random"}, "prefill_lb"),
        ({"cache": "nfs"}, "cache"),
        ({"persist": "some"}, "persist"),
        ({"decodes": 0}, "decodes"),
        ({"time_scale": 0.0}, "time_scale"),
    ],
)
def test_bad_values_are_named(kwargs, names):
    with pytest.raises(ValueError, match=names):
        SimConfig(**kwargs)


def test_a_scaled_role_needs_an_instance_to_measure_its_demand():
    bounds = RoleBounds(min_instances=0, max_instances=2)
    with pytest.raises(ValueError, match="min_instances"):
        SimConfig(scaling=AutoscalerConfig(prefill=bounds, decode=bounds))
    assert SimConfig().describe()["prefill_lb"] == "bucketed"
