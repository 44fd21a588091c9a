"""The decode step-time model: its closed-form sums and their inverse."""

from __future__ import annotations

import pytest

from dsi.model.config import FLASH
from dsi.sim.step_time import StepTimeModel


def test_steps_s_is_the_sum_of_growing_steps():
    m = StepTimeModel(0.02, 1e-5, 1e-7)
    batch, kv = 7, 10_000
    assert m.steps_s(batch, kv, 5) == pytest.approx(sum(m.step_s(batch, kv + i * batch) for i in range(5)))
    assert m.steps_s(batch, kv, 0) == 0


@pytest.mark.parametrize("per_kv", [0.0, 1e-7])
def test_steps_within_is_the_largest_whole_count(per_kv):
    m = StepTimeModel(0.02, 1e-5, per_kv)
    for seconds in (0.0, 0.019, 0.02, 0.5, 3.21):
        n = m.steps_within(3, 5_000, seconds)
        assert m.steps_s(3, 5_000, n) <= seconds < m.steps_s(3, 5_000, n + 1)


def test_of_shape_prices_a_request_far_above_a_kv_token_on_flash():
    m = StepTimeModel.of_shape(FLASH, 400e12, 3e12, 0.01)
    assert 100_000 < m.per_request_s / m.per_kv_token_s < 400_000


def test_a_step_must_take_time():
    with pytest.raises(ValueError):
        StepTimeModel(0.0, 0.0, 1e-9)
