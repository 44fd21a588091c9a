"""Expert parallelism over gloo processes against the single-process engine: same logits (to
1e-5; the products are row-invariant, so in practice the same bits) and the same greedy tokens,
before and after rebalances. Attention runs data-parallel: a step's sequences are split over the
ranks (one-sequence steps leave the other ranks without rows, still taking part)."""

import pytest
import torch

from dsi.engine.batch import StepSlice
from dsi.engine.engine import Engine, EngineConfig
from dsi.engine.params import SamplingParams
from dsi.engine.runner import ModelRunner
from dsi.eplb import resize
from dsi.eplb.group import EpOptions, ExpertGroup
from dsi.model.config import TINY
from dsi.model.hits import consumer_start
from dsi.model.weights import init_weights
from tests.dsi.engine.conftest import random_prompts

PROMPTS = random_prompts([3, 20], seed=16)
BATCH = random_prompts([128, 129, 3, 40, 12, 1], seed=17)  # one step over the ranks; two ring snapshots
SKEWED = torch.tensor([[90, 2, 1, 1, 40, 1, 1, 20]] * TINY.n_layers)  # [L, E]


@pytest.fixture(scope="module")
def weights():
    return init_weights(TINY)


def _logits(runner: ModelRunner, prompt: list[int], decode: int = 2) -> list[torch.Tensor]:
    """Prefill in chunks of 128, then greedy one-token steps; the logits of each step [V]."""
    slot, table = runner.slots.allocate(), runner.pool.allocate(-(-(len(prompt) + decode) // 128))
    start, tokens, out = consumer_start(len(prompt), TINY.keep), list(prompt), []
    for a in range(0, len(prompt), 128):
        b = min(len(prompt), a + 128)
        logits = runner.forward([StepSlice(slot, table, a, prompt[a:b], start, b == len(prompt))])
    for _ in range(decode):
        out.append(logits[0])
        tokens.append(int(logits[0].argmax()))
        logits = runner.forward([StepSlice(slot, table, len(tokens) - 1, tokens[-1:], start, True)])
    runner.slots.free(slot)
    runner.pool.free(table)
    return out


def _greedy(weights, experts=None) -> dict[str, list[int]]:
    engine = Engine(TINY, weights, EngineConfig(num_blocks=32, num_slots=4, max_running=4), experts)
    try:
        for i, p in enumerate(PROMPTS):
            engine.add_request(str(i), p, SamplingParams(max_tokens=3, temperature=0))
        return {o.request_id: o.output for o in engine.run_until_done() if o.finished}
    finally:
        engine.close()


def _together(runner, prompts: list[list[int]], decode: int = 2) -> list[tuple[torch.Tensor, dict]]:
    """All prompts prefilled in one step, then decoded together: (logits, ring snapshots) per step."""
    seqs = [
        (runner.slots.allocate(), runner.pool.allocate(-(-(len(p) + decode) // 128)), list(p))
        for p in prompts
    ]
    out, first = [], True
    for _ in range(decode + 1):
        batch = [
            StepSlice(
                slot,
                table,
                0 if first else len(t) - 1,
                t if first else t[-1:],
                consumer_start(len(p), TINY.keep),
                True,
            )
            for (slot, table, t), p in zip(seqs, prompts, strict=True)
        ]
        snaps: dict = {}
        logits = runner.forward(batch, snaps)
        out.append((logits, snaps))
        for (_, _, t), row in zip(seqs, logits, strict=True):
            t.append(int(row.argmax()))
        first = False
    for slot, table, _ in seqs:
        runner.slots.free(slot)
        runner.pool.free(table)
    return out


@pytest.fixture(scope="module")
def single(weights):
    """The single-process references, computed with one torch thread, as each rank of a group on
    2 cores: on a loaded host two threads spin against each other and took 10 times as long."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        runner = ModelRunner(TINY, weights, num_blocks=16, num_slots=8)
        return [_logits(runner, p) for p in PROMPTS], _greedy(weights), _together(runner, BATCH)
    finally:
        torch.set_num_threads(threads)


def _same_steps(got, want):
    for (logits, snaps), (ref, ref_snaps) in zip(got, want, strict=True):
        assert float((logits - ref).abs().max()) <= 1e-5
        assert snaps.keys() == ref_snaps.keys()
        for j, (b, snap) in snaps.items():
            assert b == ref_snaps[j][0] and torch.equal(snap, ref_snaps[j][1])


def _same_logits(runner, expected):
    for prompt, want in zip(PROMPTS, expected, strict=True):
        for got, ref in zip(_logits(runner, prompt), want, strict=True):
            assert float((got - ref).abs().max()) <= 1e-5


@pytest.mark.slow
@pytest.mark.concurrent
@pytest.mark.parametrize("ep_size", [2, 4])
def test_expert_parallel_matches_single_process(weights, single, ep_size):
    logits, tokens, together = single
    options = EpOptions(resize(ep_size, ep_size, TINY.n_experts, 1), window_steps=4, rebalance_steps=2)
    group = ExpertGroup.start(TINY, weights, options)
    try:
        assert group.size == ep_size and group.placement.slots_per_rank == 8 // ep_size + 1
        runner = group.runner(TINY, weights, 16, 8)
        _same_logits(runner, logits)
        _same_steps(_together(runner, BATCH), together)
        assert min(runner.last_tokens) > 0  # the decode step gave every rank rows
        assert sorted(together[0][1]) == [0, 1]  # ring snapshots of both long prompts, one from rank 1
        assert group.check(weights) <= 1e-5  # every rank routes tokens of its own (data parallel)

        before = group.placement.slot_expert.clone()
        group.rebalance(SKEWED)
        assert not torch.equal(before, group.placement.slot_expert)
        assert group.placement.replica_count()[0, 0] >= 2  # the hottest expert got a replica
        _same_steps(_together(runner, BATCH), together)
    except BaseException:
        group.close()
        raise
    # The engine rebalances from its own counts every 2 steps, between steps; tokens stay the same.
    rebalances = group.rebalances
    assert _greedy(weights, group) == tokens  # closes the group
    assert group.rebalances > rebalances
