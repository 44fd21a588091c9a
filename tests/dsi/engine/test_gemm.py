"""PackedGemm: the dense runner's products through packed weights keep a row's bits whatever the
row count, and equal ``x @ w`` to fp32 rounding."""

import random

import pytest
import torch

from dsi.engine.gemm import PackedGemm


@pytest.mark.parametrize("k,n", [(576, 192), (1536, 576), (576, 4096)])
def test_packed_rows_do_not_depend_on_the_row_count_or_position(k, n):
    torch.manual_seed(0)
    w = torch.randn(k, n)
    mm = PackedGemm([w])
    x = torch.randn(k)
    want = mm(x[None], w)[0]
    rng = random.Random(1)
    for m in [1, 2, 3, 7, 8, 9, 17, 31, 32, 33, 100]:
        rows = torch.randn(m, k)
        at = rng.randrange(m)
        rows[at] = x
        assert torch.equal(mm(rows, w)[at], want), m
    assert torch.allclose(want, x @ w, atol=1e-4, rtol=1e-4)


def test_a_transposed_view_and_an_unknown_weight_work():
    torch.manual_seed(1)
    table = torch.randn(300, 64)  # [V, H], used as x @ table.T (a tied output projection)
    other = torch.randn(64, 10)
    mm = PackedGemm([table.T])
    x = torch.randn(5, 64)
    assert torch.allclose(mm(x, table.T), x @ table.T, atol=1e-4, rtol=1e-4)
    assert torch.allclose(mm(x, other), x @ other, atol=1e-5, rtol=1e-5)  # not packed: plain @
    assert mm(x, other).shape == (5, 10)
