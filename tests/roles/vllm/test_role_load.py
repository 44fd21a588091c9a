"""What a vLLM role reports of the requests vLLM has been given but not yet scheduled."""

from dsi.roles.vllm.role import waiting_tokens


def test_the_last_given_requests_are_the_waiting_ones():
    assert waiting_tokens([900, 2000, 300], 2) == 2300  # the first is being prefilled
    assert waiting_tokens([900, 2000, 300], 0) == 0


def test_vllms_count_beyond_what_the_role_gave_is_bounded_by_it():
    # vLLM's counts come a step late: more waiting than the role has unanswered counts them all
    assert waiting_tokens([900, 2000], 5) == 2900
    assert waiting_tokens([], 3) == 0
