"""PackedGemm: the dense runner's products through packed weights keep a row's bits whatever the
row count, and equal ``x @ w`` to fp32 rounding."""

import pytest
import torch

from dsi.engine.gemm import PackedGemm
from tests.dsi.engine.conftest import ROW_COUNTS, rows_with


@pytest.mark.parametrize("k,n", [(576, 192), (1536, 576), (576, 4096)])
def test_packed_rows_do_not_depend_on_the_row_count_position_or_thread_count(k, n, threads):
    torch.manual_seed(0)
    w = torch.randn(k, n)
    mm = PackedGemm([w])
    x = torch.randn(k)
    threads(1)
    want = mm(x[None], w)[0]
    for t in (1, 2):
        threads(t)
        for m in ROW_COUNTS:
            rows, at = rows_with(x, m, seed=m)
            assert torch.equal(mm(rows, w)[at], want), (t, m)
    assert torch.allclose(want, x @ w, atol=1e-4, rtol=1e-4)


def test_a_weight_it_has_not_packed_is_batch_invariant_too(threads):
    torch.manual_seed(2)
    w, x = torch.randn(64, 300), torch.randn(64)
    mm = PackedGemm([])
    want = mm(x[None], w)[0]
    for m in (1, 9, 16, 17, 100):
        rows, at = rows_with(x, m, seed=m)
        assert torch.equal(mm(rows, w)[at], want), m


def test_a_transposed_view_and_an_unknown_weight_work():
    torch.manual_seed(1)
    table = torch.randn(300, 64)  # [V, H], used as x @ table.T (a tied output projection)
    other = torch.randn(64, 10)
    mm = PackedGemm([table.T])
    x = torch.randn(5, 64)
    assert torch.allclose(mm(x, table.T), x @ table.T, atol=1e-4, rtol=1e-4)
    assert torch.allclose(mm(x, other), x @ other, atol=1e-5, rtol=1e-5)  # not packed: plain @
    assert mm(x, other).shape == (5, 10)
