"""A runner given an MoE layer (an expert-parallel group's collective) calls it at every layer of
every step, also for a layer with no rows, so the group's ranks step together."""

import torch

from dsi.engine.batch import StepSlice
from dsi.engine.runner import ModelRunner
from dsi.model.config import TINY
from dsi.model.ops import moe


def test_every_layer_calls_the_moe_layer_even_without_rows(tiny):
    _, w = tiny
    calls = []

    def layer(i, x):
        calls.append((i, x.shape[0]))
        return moe(x, w, f"layers.{i}.", TINY)

    runner = ModelRunner(TINY, w, num_blocks=4, num_slots=1, moe_layer=layer)
    slot, table = runner.slots.allocate(), runner.pool.allocate(2)
    # A first chunk below consumer_start: the consumer layers have no rows.
    out = runner.forward([StepSlice(slot, table, 0, list(range(100, 110)), 150, False)])
    assert out.shape == (0, TINY.vocab_size)
    assert calls == [(i, 10 if i < TINY.n_producer else 0) for i in range(TINY.n_layers)]
    assert torch.equal(
        runner.last_hidden([StepSlice(slot, table, 10, [7], 150, False)]), torch.empty(0, TINY.hidden)
    )
