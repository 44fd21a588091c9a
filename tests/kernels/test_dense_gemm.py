"""The dense product C kernel: equal to ``x @ w`` to fp32 rounding, and a row's bits the same for
any row count, position, thread count and weight layout."""

import multiprocessing
import threading

import pytest
import torch

from dsi.kernels import dense_gemm, native, thread_pool

pytestmark = pytest.mark.skipif(
    not dense_gemm.available(), reason=f"no C kernel here: {native.why_not('dense_gemm')}"
)

# Row counts around register tiles (6 or 8 rows), row blocks (96) and thread shares.
ROWS = [*range(1, 26), 31, 32, 33, 47, 48, 49, 95, 96, 97, 191, 192, 193, 500, 1441]


@pytest.mark.parametrize("k,n", [(576, 960), (1536, 576), (64, 100), (33, 17), (1, 5), (7, 1)])
def test_products_equal_torch_to_fp32_rounding(k, n):
    gen = torch.Generator().manual_seed(k * 1000 + n)
    w, x = torch.randn(k, n, generator=gen), torch.randn(40, k, generator=gen)
    got = dense_gemm.gemm(x, dense_gemm.pack(w))
    assert got.shape == (40, n)
    assert torch.allclose(got, x @ w, atol=1e-4 * k**0.5, rtol=1e-4)


@pytest.mark.parametrize("k,n", [(576, 960), (100, 37)])
def test_a_rows_bits_do_not_depend_on_row_count_position_or_threads(k, n):
    gen = torch.Generator().manual_seed(3)
    w, x = torch.randn(k, n, generator=gen), torch.randn(k, generator=gen)
    packed = dense_gemm.pack(w)
    want = dense_gemm.gemm(x[None], packed, threads=1)[0]
    for m in ROWS:
        rows = torch.randn(m, k, generator=gen)
        at = (m * 7) % m
        rows[at] = x
        for t in (1, 2, 3):
            assert torch.equal(dense_gemm.gemm(rows, packed, threads=t)[at], want), (m, t)


def test_a_transposed_view_packs_as_its_copy_and_strided_rows_are_read_in_place():
    gen = torch.Generator().manual_seed(4)
    table = torch.randn(300, 64, generator=gen)  # [V, H], used as x @ table.T
    wide = torch.randn(20, 100, generator=gen)
    x = wide[:, 10:74]  # rows 100 apart
    a = dense_gemm.gemm(x, dense_gemm.pack(table.T))
    b = dense_gemm.gemm(x.contiguous(), dense_gemm.pack(table.T.contiguous()))
    assert torch.equal(a, b)
    assert torch.allclose(a, x @ table.T, atol=1e-4, rtol=1e-4)


def test_out_takes_a_row_range_of_a_larger_result():
    gen = torch.Generator().manual_seed(5)
    w, x = torch.randn(64, 48, generator=gen), torch.randn(10, 64, generator=gen)
    packed = dense_gemm.pack(w)
    big = torch.full((14, 48), float("nan"))
    got = dense_gemm.gemm(x[3:7], packed, out=big[5:9])
    assert got.data_ptr() == big[5].data_ptr()
    assert torch.equal(big[5:9], dense_gemm.gemm(x, packed)[3:7])
    assert big[:5].isnan().all() and big[9:].isnan().all()


def test_bad_inputs_are_refused():
    packed = dense_gemm.pack(torch.randn(8, 4))
    with pytest.raises(ValueError, match="does not fit"):
        dense_gemm.gemm(torch.randn(3, 9), packed)
    with pytest.raises(ValueError, match="does not fit"):
        dense_gemm.gemm(torch.randn(3, 8, dtype=torch.float64), packed)
    with pytest.raises(ValueError, match="2-D fp32"):
        dense_gemm.pack(torch.randn(8, 4, dtype=torch.float16))
    with pytest.raises(ValueError, match="out must be"):
        dense_gemm.gemm(torch.randn(3, 8), packed, out=torch.empty(3, 5))
    assert dense_gemm.gemm(torch.randn(0, 8), packed).shape == (0, 4)


def test_threads_that_call_at_once_each_get_their_own_product():
    gen = torch.Generator().manual_seed(6)
    ws = [torch.randn(256, 480, generator=gen) for _ in range(4)]
    xs = [torch.randn(64, 256, generator=gen) for _ in range(4)]
    packed = [dense_gemm.pack(w) for w in ws]
    want = [dense_gemm.gemm(x, p, threads=1) for x, p in zip(xs, packed, strict=True)]
    bad: list[int] = []

    def run(i: int) -> None:
        for _ in range(30):
            if not torch.equal(dense_gemm.gemm(xs[i], packed[i], threads=2), want[i]):
                bad.append(i)

    callers = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for c in callers:
        c.start()
    for c in callers:
        c.join(timeout=60)
    assert not any(c.is_alive() for c in callers) and not bad
    assert thread_pool.workers() >= 1


def _child(queue) -> None:
    gen = torch.Generator().manual_seed(7)
    w, x = torch.randn(128, 960, generator=gen), torch.randn(32, 128, generator=gen)
    packed = dense_gemm.pack(w)
    before = thread_pool.workers()
    shared = dense_gemm.gemm(x, packed, threads=2)
    queue.put((before, thread_pool.workers(), torch.equal(shared, dense_gemm.gemm(x, packed, threads=1))))


def test_a_forked_child_starts_its_own_workers():
    dense_gemm.gemm(torch.randn(32, 128), dense_gemm.pack(torch.randn(128, 960)), threads=2)
    assert thread_pool.workers() >= 1  # the parent's workers exist; a child has none of them
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child, args=(queue,))
    child.start()
    try:
        before, after, same = queue.get(timeout=60)
    finally:
        child.join(timeout=10)
        if child.is_alive():
            child.kill()
            child.join()
    assert (before, after, same) == (0, 1, True)
