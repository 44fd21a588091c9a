"""The sampler with constraints, on crafted logits: the mask wins over the model, rows without a
constraint are untouched, and a reasoning section stays free until ``</think>``."""

import pytest
import torch

from dsi.engine.params import SamplingParams
from dsi.engine.sampler import sample
from dsi.structured import Rejecting, StructuredSpec, default_compiler
from dsi.structured.vocab import THINK_END_ID, VOCAB_SIZE
from dsi.tokenizer import EOS_ID, load_tokenizer

GREEDY = SamplingParams(temperature=0)
SAMPLED = SamplingParams(temperature=0.8, top_p=0.9, seed=7)


def _id(text: str) -> int:
    ids = load_tokenizer().encode(text, add_special_tokens=False).ids
    assert len(ids) == 1, ids
    return ids[0]


def _favouring(*tokens: int, rows: int = 1) -> torch.Tensor:
    """[rows, V] logits: zero everywhere, large on ``tokens`` (the first one largest)."""
    logits = torch.zeros(rows, VOCAB_SIZE)
    for rank, token in enumerate(tokens):
        logits[:, token] = 50.0 - rank
    return logits


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_mask_overrides_the_model(params):
    digits = default_compiler().constraint(StructuredSpec.for_regex("[0-9]{2}"))
    out = sample(_favouring(_id("hello"), _id("7")), [params], [1], [10], [digits])
    assert out[0].token == _id("7") and out[0].finish is None
    out = sample(_favouring(_id("hello")), [params], [1], [11], [digits])  # model has no digit preference
    assert load_tokenizer().decode([out[0].token]).isdigit() and out[0].finish == "stop"


def test_unconstrained_rows_are_untouched():
    logits = _favouring(_id("hello"), rows=2)
    constraint = default_compiler().constraint(StructuredSpec.json_object())
    out = sample(logits, [GREEDY, GREEDY], [0, 0], [5, 5], [None, constraint])
    assert out[0].token == _id("hello")
    assert load_tokenizer().decode([out[1].token]).startswith("{")


def test_logprobs_are_of_the_constrained_distribution():
    constraint = default_compiler().constraint(StructuredSpec.for_regex("(yes|no)"))
    params = SamplingParams(temperature=0, logprobs=True, top_logprobs=3)
    out = sample(_favouring(_id("hello"), _id("no")), [params], [0], [0], [constraint])[0]
    assert out.token == _id("no") and out.logprob > -1e-3  # nearly all mass left is on "no"
    assert _id("hello") not in [t for t, _ in out.top]


def test_reasoning_is_free_until_think_end():
    json_after_think = default_compiler().constraint(StructuredSpec.json_object(after_think=True))
    hello = _id("hello")
    for position in range(3):  # reasoning: the model's choice stands, EOS included
        out = sample(_favouring(hello), [GREEDY], [0], [position], [json_after_think])
        assert out[0].token == hello and out[0].finish is None
    out = sample(_favouring(THINK_END_ID), [GREEDY], [0], [3], [json_after_think])
    assert out[0].token == THINK_END_ID and json_after_think.started
    out = sample(_favouring(hello, EOS_ID), [GREEDY], [0], [4], [json_after_think])
    assert load_tokenizer().decode([out[0].token]).startswith("{")


def test_eos_in_reasoning_is_not_masked():
    constraint = default_compiler().constraint(StructuredSpec.for_regex("[a-z]+", after_think=True))
    out = sample(_favouring(EOS_ID), [GREEDY], [0], [0], [constraint])
    assert out[0].token == EOS_ID and out[0].finish is None


def test_after_think_rollback_reopens_reasoning():
    constraint = default_compiler().constraint(StructuredSpec.for_regex("[0-9]+", after_think=True))
    assert constraint.accept(_id("hello")) and constraint.accept(THINK_END_ID) and constraint.accept(_id("7"))
    constraint.rollback(2)
    assert not constraint.started and constraint.accept(_id("hello"))


def test_rejecting_constraint_finishes_with_error():
    out = sample(_favouring(_id("hello")), [GREEDY], [0], [0], [Rejecting()])
    assert out[0].token == EOS_ID and out[0].finish == "error"
