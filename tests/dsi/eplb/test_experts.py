import pytest
import torch

from dsi.eplb import Placement
from dsi.eplb.experts import held_by, move_plan, rank0_holds_all


def test_moves_only_what_a_rank_lacks_from_the_lowest_holder():
    old = Placement(torch.tensor([[0, 1, 2, 3, 3, 1]]), 3, 4)  # rank 0: {0,1}, 1: {2,3}, 2: {3,1}
    new = Placement(torch.tensor([[0, 2, 1, 3, 3, 1]]), 3, 4)  # rank 0 needs 2, rank 1 needs 1
    assert move_plan(held_by(old), new) == [(1, 0, 0, 2), (0, 1, 0, 1)]
    assert move_plan(held_by(new), new) == []


def test_first_install_comes_from_rank_0():
    new = Placement(torch.tensor([[1, 0], [0, 1]]), 2, 2)
    assert move_plan(rank0_holds_all(2, 2, 2), new) == [(0, 1, 0, 0), (0, 1, 1, 1)]
    with pytest.raises(ValueError, match="held by no rank"):
        move_plan([set(), set()], new)
