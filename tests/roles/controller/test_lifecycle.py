import pytest

from dsi.roles.controller.lifecycle import (
    ENTRY,
    TRANSITIONS,
    IllegalTransition,
    InstanceState,
    Transition,
    TransitionCounter,
    check_transition,
)

S = InstanceState
ALLOWED = [
    (S.STARTING, S.READY),
    (S.READY, S.SERVING),
    (S.READY, S.DRAINING),
    (S.SERVING, S.DRAINING),
    (S.DRAINING, S.READY),
    (S.DRAINING, S.SERVING),
    *((live, end) for live in (S.STARTING, S.READY, S.SERVING, S.DRAINING) for end in (S.STOPPED, S.DEAD)),
]


def test_the_allowed_transitions_are_exactly_the_lifecycle():
    assert set(ALLOWED) == TRANSITIONS


@pytest.mark.parametrize(("before", "after"), ALLOWED)
def test_every_allowed_transition_passes(before, after):
    check_transition(before, after)


@pytest.mark.parametrize(
    ("before", "after"),
    [(b, a) for b in S for a in S if (b, a) not in TRANSITIONS],
)
def test_every_other_transition_is_refused_with_a_typed_error(before, after):
    with pytest.raises(IllegalTransition, match=f"{before} -> {after}"):
        check_transition(before, after)


def test_registration_takes_a_live_state_only():
    for state in ENTRY:
        check_transition(None, state)
    for final in (S.STOPPED, S.DEAD):
        with pytest.raises(IllegalTransition, match=f"none -> {final}"):
            check_transition(None, final)


def test_counter_keys_by_role_from_and_to():
    counter = TransitionCounter()
    counter.add(Transition("d0", "decode", None, S.READY, "registered"))
    counter.add(Transition("d0", "decode", S.READY, S.SERVING, "assigned"))
    counter.add(Transition("d1", "decode", S.READY, S.SERVING, "assigned"))
    counter.add(Transition("p0", "prefill", S.SERVING, S.DEAD, "missed heartbeats"))
    assert counter.counts() == {
        ("decode", "none", "ready"): 1,
        ("decode", "ready", "serving"): 2,
        ("prefill", "serving", "dead"): 1,
    }
    assert Transition("d0", "decode", S.READY, S.SERVING, "assigned").describe() == (
        "d0 (decode): ready -> serving (assigned)"
    )
