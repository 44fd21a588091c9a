import pytest
import torch

from dsi.eplb import Placement, imbalance, policy_for, rebalance
from dsi.eplb.packing import pack, replicate

# DeepSeek's published EPLB example: 2 layers x 12 experts, 16 slots, 4 groups, 2 nodes, 8 ranks.
DEEPSEEK_LOAD = torch.tensor(
    [
        [90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
        [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27],
    ]
)


def test_worked_example_from_the_docstring():
    load = torch.tensor([[10, 40, 20, 30]])
    p = rebalance(load, num_ranks=2, slots_per_rank=3)
    assert p.slot_expert.tolist() == [[1, 1, 0, 2, 3, 3]]
    assert p.rank_load(load).tolist() == [[50.0, 50.0]]
    assert p.replica_count().tolist() == [[1, 2, 1, 2]]


def test_hierarchical_matches_deepseeks_published_output():
    p = rebalance(
        DEEPSEEK_LOAD, num_ranks=8, slots_per_rank=2, policy="hierarchical", num_groups=4, num_nodes=2
    )
    assert p.slot_expert.tolist() == [
        [5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
        [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1],
    ]
    # Node 0 (ranks 0-3) holds exactly the experts of two whole groups of 3.
    node0 = set(p.slot_expert[0, :8].tolist())
    assert node0 == {3, 4, 5, 6, 7, 8}


def test_global_ignores_groups():
    p = rebalance(DEEPSEEK_LOAD, num_ranks=8, slots_per_rank=2, policy="global")
    assert p.slot_expert.tolist() == [
        [10, 6, 10, 7, 0, 2, 11, 4, 5, 9, 5, 4, 8, 3, 1, 1],
        [1, 10, 2, 4, 5, 11, 5, 0, 6, 7, 6, 3, 8, 8, 9, 7],
    ]
    in_order = Placement(torch.arange(12).repeat(2, 1), 6, 12)  # 2 experts per rank, no replicas
    assert imbalance(p.rank_load(DEEPSEEK_LOAD)) < imbalance(in_order.rank_load(DEEPSEEK_LOAD))


def test_policy_by_role():
    assert policy_for("prefill") == "hierarchical"
    assert policy_for("decode") == "global"


def test_replicate_gives_extra_slots_to_the_heaviest_per_replica():
    slots, count = replicate(torch.tensor([[1, 9, 4]]), 5)
    assert slots.tolist() == [[0, 1, 2, 1, 1]]  # 9 -> 4.5 each (> 4), then 9 / 3 = 3
    assert count.tolist() == [[1, 3, 1]]


def test_pack_keeps_bins_even_in_count():
    bins, pos = pack(torch.tensor([[5.0, 4.0, 3.0, 3.0]]), 2)
    assert bins.tolist() == [[0, 1, 1, 0]] and pos.tolist() == [[0, 0, 1, 1]]


def test_placement_rejects_a_missing_expert_and_uneven_slots():
    with pytest.raises(ValueError, match="expert 2 has no replica"):
        Placement(torch.tensor([[0, 1, 1, 0]]), 2, 3)
    with pytest.raises(ValueError, match="split evenly"):
        Placement(torch.tensor([[0, 1, 2]]), 2, 3)
    with pytest.raises(ValueError, match="cannot hold"):
        rebalance(torch.ones(1, 8), num_ranks=2, slots_per_rank=3)


def test_placement_round_trips_through_a_tensor():
    p = rebalance(DEEPSEEK_LOAD, 8, 2)
    q = Placement.from_tensor(p.to_tensor(), 2)
    assert torch.equal(q.slot_expert, p.slot_expert) and (q.num_ranks, q.num_experts) == (8, 12)
