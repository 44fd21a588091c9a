import torch

from dsi.eplb import LoadWindow, Placement, pick_slots, water_fill


def test_water_fill_levels_the_lowest_bins_first():
    assert water_fill([5, 0, 3], 4) == [0, 4, 0]
    assert water_fill([0, 0], 5) == [3, 2]
    assert water_fill([2, 9], 3) == [3, 0]
    assert water_fill([4, 4, 4], 0) == [0, 0, 0]


def test_pairs_of_a_replicated_expert_split_by_rank_load():
    # 2 ranks x 2 slots: rank 0 holds experts [0, 2], rank 1 holds [1, 2].
    p = Placement(torch.tensor([[0, 2, 1, 2]]), 2, 3)
    experts = torch.tensor([0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 1, 1])
    slots = pick_slots(experts, p, 0)
    # Single-replica experts first: rank 0 has 4 pairs, rank 1 has 2. Expert 2's six pairs
    # water-fill: rank 1 gets 2 to reach 4, the other 4 split 2 / 2 (rank 0: slot 1, rank 1: slot 3).
    assert slots.tolist() == [0, 0, 0, 0, 1, 1, 3, 3, 3, 3, 2, 2]
    load = torch.bincount(slots // 2, minlength=2).tolist()
    assert load == [6, 6]


def test_load_window_forgets_the_oldest_step():
    w = LoadWindow(1, 2, steps=2)
    w.push(torch.tensor([[1, 0]]))
    w.push(torch.tensor([[0, 2]]))
    w.push(torch.tensor([[4, 0]]))
    assert w.total().tolist() == [[4, 2]] and w.steps_seen == 3
