"""Sampled requests on a speculating engine are batch-invariant: a request's tokens alone equal
its tokens in a batch of 16 others, and equal speculation off, although DSpark verifies
different drafts for it in the two runs (a failover re-run with the same seed reproduces them)."""

import pytest
import torch

from dsi.engine.engine import Engine, EngineConfig
from dsi.engine.params import SamplingParams
from dsi.engine.speculator import Speculator
from dsi.engine.step_curve import StepCurve
from dsi.model.draft import init_draft
from tests.dsi.engine.conftest import random_prompts

MAX_TOKENS = 10
# Drafts cost little alone and much in a batch, so that DSpark verifies fewer of them there.
CURVE = StepCurve(
    (1, 8), (1, 2, 3, 4, 6), ((1.0, 1.05, 1.1, 1.15, 1.25), (1.0, 1.6, 2.2, 2.8, 4.0)), (0.0, 0.0)
)
IDS = tuple(str(i) for i in range(17))
PROMPTS = dict(zip(IDS, random_prompts([3 + 2 * i for i in range(len(IDS))], seed=11), strict=True))
ALONE = ("0", "1")
GREEDY = ("5", "11")  # greedy requests in the batch: speculation leaves them unchanged too


def _params(rid: str) -> SamplingParams:
    temperature = 0.0 if rid in GREEDY else 0.8
    seed = 1000 + int(rid)
    logprobs = int(rid) % 2 == 0  # a request without them reports 0.0 whatever its batch asks
    return SamplingParams(
        max_tokens=MAX_TOKENS, temperature=temperature, seed=seed, ignore_eos=True, logprobs=logprobs
    )


@pytest.fixture(scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the bits do not depend on it; a shared machine runs faster so
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def off(tiny, one_thread):
    """Every request of IDS together, speculation off (a request's tokens do not depend on its
    batch there: tests/dsi/engine/test_invariant.py)."""
    return _run(tiny, IDS, "off")[0]


def _run(tiny, ids, mode, oracle=None, pipelined=False):
    """Requests ``ids`` together: id -> (tokens, logprobs), and id -> the drafts verified per step."""
    cfg, w = tiny
    draft = init_draft(cfg.hidden, torch.arange(512), layers=1, ffn=64) if mode != "off" else None
    config = EngineConfig(async_scheduling=pipelined, speculative=mode, step_curve=CURVE)
    engine = Engine(cfg, w, config, draft=draft)
    lengths: dict[str, list[int]] = {}
    if oracle is not None:
        _steer(engine.spec, oracle, lengths)
    try:
        for rid in ids:
            engine.add_request(rid, PROMPTS[rid], _params(rid))
        done = {o.request_id: (o.output, o.logprobs) for o in engine.run_until_done() if o.finished}
    finally:
        engine.close()
    assert engine.runner.pool.num_free == engine.config.num_blocks - 1
    return done, lengths


def _steer(spec: Speculator, oracle: dict, lengths: dict[str, list[int]]) -> None:
    """Drafts: the true continuation with one wrong token at a position that moves every step,
    and confidences that fall with the position, so that DSpark's lengths depend on the batch
    and 0..5 drafts are accepted. Records the drafts each step verifies per request."""
    propose, plan = spec.propose, spec.plan

    def steered(reqs, hidden, tokens, positions):
        propose(reqs, hidden, tokens, positions)
        for req, pos in zip(reqs, positions, strict=True):
            d = spec._drafts[id(req)]
            truth = oracle[req.request_id][0][pos - len(req.prompt) :][: len(d.tokens)]
            d.tokens[: len(truth)] = [t + 1 if j == pos % 7 else t for j, t in enumerate(truth)]
            d.confidence = [0.97 - 0.06 * ((pos + j) % 4) for j in range(len(d.tokens))]

    def recorded(running, positions, base_tokens, budget):
        chosen = plan(running, positions, base_tokens, budget)
        for req in running:
            lengths.setdefault(req.request_id, []).append(chosen.get(id(req), 0))
        return chosen

    spec.propose, spec.plan = steered, recorded


def test_sampled_tokens_alone_equal_tokens_in_a_batch_of_16(tiny, off):
    together, lengths = _run(tiny, IDS, "dspark", oracle=off)
    assert together == off  # tokens and logprobs, greedy and sampled, bit for bit
    for rid in ALONE:
        alone, alone_lengths = _run(tiny, (rid,), "dspark", oracle=off)
        assert alone[rid] == together[rid]
        assert alone_lengths[rid] != lengths[rid]  # the drafts verified differed; the tokens did not
    assert any(n >= 2 for n in lengths["0"]) and all(len(off[r][0]) == MAX_TOKENS for r in IDS)


def test_sampled_tokens_with_async_scheduling_equal_speculation_off(tiny, off):
    """Async scheduling drafts from one-step-stale confidences and gives a request one token after
    each verify slice: other drafts, the same tokens."""
    ids = IDS[:6]
    pipelined, lengths = _run(tiny, ids, "fixed", oracle=off, pipelined=True)
    assert pipelined == {rid: off[rid] for rid in ids}
    assert any(n > 0 for n in lengths["0"])
