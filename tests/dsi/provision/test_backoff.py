"""RestartBackoff as a pure policy: delays, the reset after a stable run, the cap per window."""

import pytest

from dsi.provision import RestartBackoff, RestartPolicy


def test_worked_example_of_the_docstring():
    backoff = RestartBackoff(RestartPolicy())
    delays, now = [], 0.0
    for _ in range(6):
        delay = backoff.after_exit(now, uptime_s=1.0)
        delays.append(delay)
        if delay is not None:
            now += delay + 1.0  # the replacement dies 1 s after it starts
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, None]
    assert now == 20.5


def test_delay_doubles_up_to_max():
    backoff = RestartBackoff(RestartPolicy(initial_s=1.0, max_s=5.0, max_restarts=100, window_s=1.0))
    assert [backoff.after_exit(10.0 * i, uptime_s=0.0) for i in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_a_stable_run_starts_the_delays_over():
    backoff = RestartBackoff(RestartPolicy(stable_after_s=60.0, max_restarts=100))
    assert [backoff.after_exit(t, uptime_s=1.0) for t in (0, 2, 4)] == [0.5, 1.0, 2.0]
    assert backoff.after_exit(100.0, uptime_s=60.0) == 0.5
    assert backoff.after_exit(102.0, uptime_s=59.0) == 1.0


def test_restarts_older_than_the_window_do_not_count():
    backoff = RestartBackoff(RestartPolicy(max_restarts=2, window_s=100.0))
    assert backoff.after_exit(0.0, uptime_s=0.0) is not None
    assert backoff.after_exit(50.0, uptime_s=0.0) is not None
    assert backoff.after_exit(99.0, uptime_s=0.0) is None  # 2 within the last 100 s
    assert backoff.recent_restarts == 2
    assert backoff.after_exit(100.0, uptime_s=0.0) is not None  # the one at 0 has left the window
    assert backoff.recent_restarts == 2


def test_zero_restarts_gives_up_at_the_first_death():
    assert RestartBackoff(RestartPolicy(max_restarts=0)).after_exit(0.0, uptime_s=500.0) is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("initial_s", 0.0),
        ("max_s", float("inf")),
        ("stable_after_s", -1.0),
        ("window_s", float("nan")),
        ("factor", 0.5),
        ("max_restarts", -1),
        ("max_restarts", True),
    ],
)
def test_bad_settings_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        RestartPolicy(**{field: value})


def test_max_below_initial_is_refused():
    with pytest.raises(ValueError, match="max_s"):
        RestartPolicy(initial_s=2.0, max_s=1.0)
