"""KV-assisted re-prefill: which re-runs continue after their delivered tokens, and how."""

from __future__ import annotations

import msgspec

from dsi.engine.params import SamplingParams
from dsi.messages.gateway import Generate, TokenChunk
from dsi.roles.entrypoint.recovery import Delivered, RecoveryDiverged
from dsi.roles.vllm.resume import echoed, resumable, resumed

GREEDY = SamplingParams(max_tokens=10, temperature=0.0)


def _rerun(sampling: SamplingParams = GREEDY, delivered=(7, 8, 9)) -> Generate:
    return Generate("r1", [1, 2, 3], sampling, delivered=list(delivered))


def test_only_greedy_penalty_free_reruns_with_tokens_delivered_resume():
    assert resumable(_rerun())
    assert not resumable(_rerun(delivered=()))
    assert not resumable(_rerun(delivered=(7,)))  # nothing to save: one token is decoded anyway
    for changed in (dict(temperature=0.7, seed=3), dict(frequency_penalty=0.5), dict(presence_penalty=0.1)):
        assert not resumable(_rerun(msgspec.structs.replace(GREEDY, **changed)))


def test_the_resumed_run_prefills_the_delivered_tokens_but_the_last_with_the_budget_left():
    again = resumed(_rerun())
    assert again.token_ids == [1, 2, 3, 7, 8] and again.delivered == []
    assert again.sampling.max_tokens == 8 and again.sampling.temperature == 0.0


def test_the_gateway_checks_the_regenerated_last_token_and_streams_only_what_is_new():
    had = Delivered()
    assert had.take(TokenChunk("r1", [7, 8, 9])) is not None
    had.rerun()
    first = echoed(TokenChunk("r1", [9, 10], logprobs=[-0.1, -0.2]), [7, 8])
    assert first.token_ids == [7, 8, 9, 10] and first.logprobs == [0.0, 0.0, -0.1, -0.2]
    new = had.take(first)
    assert new is not None and new.token_ids == [10] and new.logprobs == [-0.2]
    had.rerun()
    try:
        had.take(echoed(TokenChunk("r1", [4]), [7, 8]))  # the prefill came out otherwise at dk
    except RecoveryDiverged as exc:
        assert "position 2" in exc.message
    else:
        raise AssertionError("a different regenerated token must end the stream")
