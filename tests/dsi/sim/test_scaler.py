"""The autoscaler in the loop: the SLO batch and one decision applied to the fleets."""

from __future__ import annotations

from dsi.autoscale import AutoscalerConfig, RoleBounds
from dsi.sim.decode import DecodeInstance
from dsi.sim.fleet import Fleet
from dsi.sim.prefill import PrefillInstance
from dsi.sim.scaler import SimScaler, slo_batch
from dsi.sim.step_time import StepTimeModel


def test_slo_batch_is_the_largest_batch_within_the_tbt_slo():
    m = StepTimeModel(0.020, 0.001, 0.0)
    assert slo_batch(m, 0.025, 512) == 5 and slo_batch(m, 0.010, 512) == 1 and slo_batch(m, 1.0, 64) == 64


def test_a_decision_scales_decode_to_its_demand_from_the_ready_pool_first():
    model = StepTimeModel(0.02, 0.001, 0.0)
    bounds = RoleBounds(min_instances=1, max_instances=6, max_change=2, margin=0.0, ready_pool=1)
    config = AutoscalerConfig(prefill=bounds, decode=bounds, interval_s=30.0)
    prefills = Fleet.scaled("p", PrefillInstance, bounds)
    decodes = Fleet.scaled("d", lambda n: DecodeInstance(n, model, 10, 10**6), bounds)
    scaler = SimScaler(config, prefill_capacity=1_000.0, decode_capacity=10.0, start_s=60.0)
    assert scaler.due(0.0)
    scaler.decide(0.0, prefills, decodes, uncached=0, active_peak=25)
    assert decodes.census() == (2, 0, 2)  # one taken from the pool, two started (shortfall + pool)
    assert scaler.moves["decode take"] == 1 and scaler.moves["decode start"] == 2
    assert not scaler.due(10.0) and scaler.due(30.0)
