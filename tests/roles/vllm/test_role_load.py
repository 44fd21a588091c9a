"""What a vLLM role reports of the requests vLLM has been given but not yet scheduled."""

from dsi.roles.vllm.role import VllmRole, waiting_tokens


def test_the_last_given_requests_are_the_waiting_ones():
    assert waiting_tokens([900, 2000, 300], 2) == 2300  # the first is being prefilled
    assert waiting_tokens([900, 2000, 300], 0) == 0


def test_vllms_count_beyond_what_the_role_gave_is_bounded_by_it():
    # vLLM's counts come a step late: more waiting than the role has unanswered counts them all
    assert waiting_tokens([900, 2000], 5) == 2900
    assert waiting_tokens([], 3) == 0


def test_a_decode_reports_the_prompt_tokens_its_colocated_runs_compute_until_their_first_token():
    """What the balancer routes a colocated request by: prompt work queued here (a handed-over
    request's prompt was computed by a prefill and counts nothing)."""
    role = VllmRole.__new__(VllmRole)  # the bookkeeping alone: no vLLM, no sockets
    role.starting, role.prefilling, role.reporter = {}, {}, None
    role.starts("a", 2_000, computes=1_744)  # two blocks of its prompt held or loaded
    role.starts("b", 900)  # a handoff: its KV arrives from a prefill
    role.starts("c", 300, computes=300)
    assert sum(role.prefilling.values()) == 2_044
    role.started("a")
    role.started("b")
    assert role.prefilling == {"c": 300} and list(role.starting) == ["c"]
