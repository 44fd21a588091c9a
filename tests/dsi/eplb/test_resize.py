import pytest

from dsi.eplb import initial_placement, resize


def test_three_of_four_healthy_ranks_keep_every_expert():
    ep = resize(configured=4, healthy=3, num_experts=8, redundant_per_rank=1)
    assert (ep.size, ep.slots_per_rank, ep.capacity) == (3, 3, 0.75)
    p = initial_placement(ep, num_layers=1, num_experts=8)
    # Even loads: the one spare slot goes to expert 0 (half load per replica), packed last.
    assert p.slot_expert.tolist() == [[1, 4, 7, 2, 5, 0, 3, 6, 0]]
    assert p.replica_count().min() == 1


def test_full_group_and_too_few_ranks():
    assert resize(4, 4, 8, 1).size == 4
    assert resize(4, 9, 8, 1).size == 4  # never more than configured
    assert resize(4, 2, 8, 2).size == 2  # 2 x (2 + 2) slots hold 8 experts
    with pytest.raises(ValueError, match="cannot hold 8 experts"):
        resize(4, 2, 8, 1)  # 2 x 3 slots < 8
