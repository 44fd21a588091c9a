import json

import pytest

from dsi.engine.spec_policy import dspark_lengths, fixed_lengths
from dsi.engine.step_curve import StepCurve, load_curve


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


def test_step_curve_from_a_json_file(tmp_path):
    """``[engine] step_curve``: the object ``as_dict`` gives (dsi status --json) read back."""
    curve = StepCurve((1, 8), (1, 2, 3, 4, 6), ((0.01, 0.011, 0.012, 0.013, 0.015),) * 2, (0.001, 0.002))
    path = tmp_path / "curve.json"
    path.write_text(json.dumps(curve.as_dict()))
    assert load_curve(path) == curve
    bad = curve.as_dict() | {"lengths": [2, 3, 4, 5, 6]}
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"curve\.json: .*lengths from 1"):
        load_curve(path)
    path.write_text(json.dumps({"batches": [1]}))
    with pytest.raises(ValueError, match="not a step-time curve"):
        load_curve(path)
    with pytest.raises(ValueError, match=r"missing\.json"):
        load_curve(tmp_path / "missing.json")
