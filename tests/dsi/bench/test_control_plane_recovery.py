"""How ``dsi bench control-plane`` reads a restart's samples: when a role was whole again."""

from dsi.bench.control_plane_recovery import Recovery, whole_after


def test_a_count_is_whole_from_the_first_sample_after_its_last_short_one():
    samples = [(0.1, -1), (0.5, 3), (0.9, 10), (1.3, 7), (1.7, 10), (2.1, 10)]
    assert whole_after(samples, 10) == 1.7


def test_a_count_that_never_dropped_recovered_at_once_and_one_still_short_did_not():
    assert whole_after([(0.1, 10), (0.5, 10)], 10) == 0.0
    assert whole_after([(0.1, 10), (0.5, 9)], 10) is None
    assert whole_after([], 10) is None


def test_a_run_recovers_when_its_slowest_role_does():
    assert Recovery(1.0, 2.0, 3.5, 0.0, 400, 1000).total_s == 3.5
    assert Recovery(1.0, 2.0, None, 0.0, 400, 1000).total_s is None
