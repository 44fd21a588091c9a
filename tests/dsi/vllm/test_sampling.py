"""split_logprobs: vLLM's per-position logprob dicts as the sampled logprobs and top pairs dsi sends."""

import math
from dataclasses import dataclass

from dsi.engine.params import SamplingParams
from dsi.vllm.sampling import split_logprobs


@dataclass
class Logprob:
    """vLLM's Logprob: the token's logprob and its rank in the distribution (1 = most likely)."""

    logprob: float
    rank: int | None


# Two positions: token 7 sampled at rank 2, then token 9 at rank 1. vLLM adds the sampled token to
# the requested top entries, so each dict holds up to top_logprobs + 1 entries, in no set order.
TOKENS = [7, 9]
POSITIONS = [
    {3: Logprob(-0.5, 1), 8: Logprob(-2.5, 3), 7: Logprob(-1.0, 2)},
    {4: Logprob(-3.0, 2), 9: Logprob(-0.1, 1)},
]


def test_nothing_asked_nothing_returned():
    assert split_logprobs(TOKENS, POSITIONS, SamplingParams()) == ([], [])
    assert split_logprobs(TOKENS, None, SamplingParams(logprobs=True, top_logprobs=2)) == ([], [])


def test_the_sampled_logprobs_alone():
    assert split_logprobs(TOKENS, POSITIONS, SamplingParams(logprobs=True)) == ([-1.0, -0.1], [])


def test_tops_by_rank_cut_to_top_logprobs():
    sampled, tops = split_logprobs(TOKENS, POSITIONS, SamplingParams(logprobs=True, top_logprobs=2))
    assert sampled == [-1.0, -0.1]
    assert tops == [[(3, -0.5), (7, -1.0)], [(9, -0.1), (4, -3.0)]]


def test_tops_without_the_sampled_logprobs():
    sampled, tops = split_logprobs(TOKENS, POSITIONS, SamplingParams(top_logprobs=1))
    assert sampled == []
    assert tops == [[(3, -0.5)], [(9, -0.1)]]


def test_a_sampled_token_missing_from_its_position_is_minus_infinity():
    positions = [{3: Logprob(-0.5, 1)}, None]
    sampled, tops = split_logprobs(TOKENS, positions, SamplingParams(logprobs=True, top_logprobs=1))
    assert sampled == [-math.inf, -math.inf]
    assert tops == [[(3, -0.5)], []]
