from dsi.engine.spec_policy import dspark_lengths, fixed_lengths
from dsi.engine.step_curve import StepCurve


def test_worked_example():
    lengths = dspark_lengths([[0.9, 0.8], [0.3]], 2, 2, lambda n: 1 + 0.25 * n, budget=10)
    assert lengths == [2, 0]


def test_free_tokens_take_every_draft_and_costly_ones_none():
    conf = [[0.5, 0.4, 0.3], [0.2, 0.1]]
    assert dspark_lengths(conf, 2, 2, lambda n: 1.0, budget=10) == [3, 2]
    assert dspark_lengths(conf, 2, 2, lambda n: float(n), budget=10) == [0, 0]


def test_each_request_gets_a_prefix_within_the_budget():
    conf = [[0.99, 0.98, 0.97], [0.95, 0.2], [0.5]]
    lengths = dspark_lengths(conf, 3, 3, lambda n: 1.0, budget=4)
    assert sum(lengths) == 4
    assert lengths == [3, 1, 0]


def test_fixed_lengths():
    assert fixed_lengths([5, 2, 5], 5, budget=8) == [5, 2, 1]


def test_step_curve_interpolates_in_length_and_batch():
    curve = StepCurve(
        (1, 8), (1, 2, 3, 4, 6), ((1.0, 2.0, 3.0, 4.0, 6.0), (2.0, 4.0, 6.0, 8.0, 12.0)), (0.0, 0.0)
    )
    assert curve.step_time(1, 2) == 2.0
    assert curve.step_time(8, 24) == 6.0
    assert abs(curve.step_time(8, 12) - 3.0) < 1e-9  # 1.5 tokens each
    assert abs(curve.step_time(4, 4) - (4 / 7 * 1.0 + 3 / 7 * 2.0)) < 1e-9  # 3/7 of the way to B = 8
