from dsi.eplb.rows import rank_tokens, split_rows


def test_worked_example():
    assert split_rows([100, 1, 1, 1, 50, 1], 2) == [0, 1, 1, 1, 1, 1]


def test_decode_step_splits_evenly():
    for world in (2, 3, 4):
        ranks = split_rows([1] * 64, world)
        load = rank_tokens([1] * 64, ranks, world)
        assert max(load) - min(load) <= 1 and sum(load) == 64


def test_pinned_slices_stay_on_rank_zero_and_count_there():
    ranks = split_rows([4, 4, 4, 4], 2, [True, False, False, False])
    assert ranks[0] == 0 and rank_tokens([4] * 4, ranks, 2) == [8, 8]


def test_within_one_slice_of_the_mean_and_more_ranks_than_slices():
    tokens = [37, 5, 128, 1, 1, 64, 9, 1]
    for world in (2, 3, 4):
        load = rank_tokens(tokens, split_rows(tokens, world), world)
        assert max(load) <= sum(tokens) / world + max(tokens)
    assert split_rows([3], 4) == [0] and split_rows([], 2) == []
