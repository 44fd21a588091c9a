"""The cost model: what a hit saves, what decoder-side replay saves, the handoff."""

from __future__ import annotations

import pytest

from dsi.balance import PrefillCost
from dsi.sim.cost import CostModel
from dsi.sim.profiles import get_profile

H800 = get_profile("h800")


def test_a_hit_and_decoder_side_replay_save_compute():
    on, off = CostModel.of(H800), CostModel.of(H800, replay=False)
    assert on.prefill_s(4_096, 16_384) < on.prefill_s(20_480, 0)
    assert off.prefill_flops(20_480, 0) > 1.9 * on.prefill_flops(20_480, 0)
    # without decoder-side replay the consumer half runs from position 0: a hit saves nothing
    assert off.prefill_flops(4_096, 16_384) == pytest.approx(off.prefill_flops(20_480, 0))


def test_the_balancer_is_priced_as_dsi_balance_prices_it():
    assert CostModel.of(H800).model_flops(8_000, 1_024) == PrefillCost(H800.model)(8_000, 1_024)


def test_handoff_moves_pages_and_state_at_the_transfer_rate():
    cost = CostModel.of(H800)
    assert cost.handoff_s(256) == pytest.approx((2 * cost.page_bytes + cost.state_bytes) / 50e9)
    assert cost.prefill_tokens_per_s() == pytest.approx(8192 / cost.prefill_s(8192, 0))
