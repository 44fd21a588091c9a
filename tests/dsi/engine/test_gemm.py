"""PackedGemm: the dense runner's products through packed weights keep a row's bits whatever the
row count, and equal ``x @ w`` to fp32 rounding, on both of its paths (dsi's C kernel, oneDNN)."""

import pytest
import torch

from dsi.engine.gemm import PackedGemm, onednn_available
from dsi.engine.invariant import ROW_TILE
from dsi.kernels import dense_gemm
from tests.dsi.engine.conftest import ROW_COUNTS, rows_with


@pytest.fixture(params=["c-kernel", "onednn"])
def native(request):
    """Which path PackedGemm takes (skipped where this machine has not got it)."""
    if request.param == "c-kernel" and not dense_gemm.available():
        pytest.skip("the C product kernel is not built here")
    if request.param == "onednn" and not onednn_available():
        pytest.skip("torch has no oneDNN here")
    return request.param == "c-kernel"


@pytest.mark.parametrize("k,n", [(576, 192), (1536, 576), (576, 4096)])
def test_packed_rows_do_not_depend_on_the_row_count_position_or_thread_count(k, n, threads, native):
    torch.manual_seed(0)
    w = torch.randn(k, n)
    mm = PackedGemm([w], native=native)
    x = torch.randn(k)
    threads(1)
    want = mm(x[None], w)[0]
    for t in (1, 2):
        threads(t)
        for m in ROW_COUNTS:
            rows, at = rows_with(x, m, seed=m)
            assert torch.equal(mm(rows, w)[at], want), (t, m)
    assert torch.allclose(want, x @ w, atol=1e-4, rtol=1e-4)


def test_a_weight_it_has_not_packed_is_batch_invariant_too(threads, native):
    torch.manual_seed(2)
    w, x = torch.randn(64, 300), torch.randn(64)
    mm = PackedGemm([], native=native)
    want = mm(x[None], w)[0]
    for m in (1, 9, 16, 17, 100):
        rows, at = rows_with(x, m, seed=m)
        assert torch.equal(mm(rows, w)[at], want), m


def test_a_transposed_view_and_an_unknown_weight_work(native):
    torch.manual_seed(1)
    table = torch.randn(300, 64)  # [V, H], used as x @ table.T (a tied output projection)
    other = torch.randn(64, 10)
    mm = PackedGemm([table.T], native=native)
    x = torch.randn(5, 64)
    assert torch.allclose(mm(x, table.T), x @ table.T, atol=1e-4, rtol=1e-4)
    assert torch.allclose(mm(x, other), x @ other, atol=1e-5, rtol=1e-5)  # not packed: plain @
    assert mm(x, other).shape == (5, 10)


def test_rows_are_padded_to_tiles_only_where_products_run_in_tiles(native):
    mm = PackedGemm([], batch_invariant=True, native=native)
    assert mm.row_tile == (1 if native else ROW_TILE)
    assert PackedGemm([], batch_invariant=False, native=native).row_tile == 1


def test_both_paths_agree_to_fp32_rounding():
    if not (dense_gemm.available() and onednn_available()):
        pytest.skip("needs both paths")
    torch.manual_seed(3)
    w, x = torch.randn(576, 960), torch.randn(37, 576)
    a = PackedGemm([w], native=True)(x, w)
    b = PackedGemm([w], native=False)(x, w)
    assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)
