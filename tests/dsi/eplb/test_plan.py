import torch

from dsi.engine.batch import StepSlice
from dsi.eplb.plan import decode, encode


def test_each_rank_gets_its_slices_in_step_order_with_the_same_bits():
    rows = torch.randn(2, 16)
    batch = [
        StepSlice(3, [5, 6], 0, [11, 12, 13], 0, True, embeds=[(1, rows)]),
        StepSlice(0, [7], 40, [9], 2, False, producer_start=1, cached_end=4),
        StepSlice(1, [8, 2], 130, [4, 5, 6], 0, True, num_logits=3),
    ]
    blob = encode(batch, [1, 0, 1])
    assert decode(blob, 0) == [batch[1]]
    mine = decode(blob, 1)
    assert [s.slot for s in mine] == [3, 1] and mine[1] == batch[2]
    ((row, got),) = mine[0].embeds
    assert row == 1 and torch.equal(got, rows)
    assert decode(blob, 2) == []
