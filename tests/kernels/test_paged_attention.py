"""The paged-attention C kernel against its torch reference, and the invariance it promises: a
query's result has the same bits alone, in any batch, and among its own chunk's rows."""

import pytest
import torch

from dsi.kernels import native
from dsi.kernels import paged_attention as pa

BLOCK = 128

pytestmark = pytest.mark.skipif(
    not pa.available(), reason=f"no C kernel here: {native.why_not('paged_attention')}"
)


def _pages(hkv: int, d: int, pages: int = 12, seed: int = 0) -> torch.Tensor:
    """One layer's pages [pages, 2, BLOCK, Hkv, D] cut from a two-layer pool (strided like the engine's)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(pages, 2, 2, BLOCK, hkv, d, generator=gen)[:, 1]


def _rows(hq: int, d: int, pos: list[int], seed: int = 1) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    tables = torch.tensor([[3, 7, 1], [5, 2, 9], [11, 4, 6]])
    seq = torch.tensor([r % 3 for r in range(len(pos))])
    q = torch.randn(len(pos), hq + 2, d, generator=gen)[:, :hq]  # rows strided, heads contiguous
    return q, tables, seq, torch.tensor(pos)


@pytest.mark.parametrize("hq, hkv, d", [(9, 3, 64), (4, 1, 256)])
def test_the_kernel_equals_its_reference(hq, hkv, d):
    kv = _pages(hkv, d)
    q, tables, seq, pos = _rows(hq, d, [0, 127, 128, 300, -1, 5])
    got = pa.paged_attention(q, kv, tables, seq, pos)
    want = pa.paged_attention_reference(q, kv, tables, seq, pos)
    assert torch.allclose(got, want, atol=2e-6, rtol=1e-5)
    assert torch.equal(got[4], torch.zeros(hq * d))  # pos -1: a padding row


def test_a_query_has_the_same_bits_alone_in_a_batch_and_in_its_chunk():
    kv = _pages(3, 64)
    q, tables, seq, pos = _rows(9, 64, [200, 13, 255, 256, 40, 383])
    batch = pa.paged_attention(q, kv, tables, seq, pos)
    for r in range(len(pos)):
        alone = pa.paged_attention(q[r : r + 1], kv, tables, seq[r : r + 1], pos[r : r + 1])
        assert torch.equal(alone[0], batch[r])
    # a chunk of sequence 0: positions 190 .. 209 in one call; row 10 is position 200
    chunk = q[0:1].expand(20, -1, -1).contiguous()
    out = pa.paged_attention(chunk, kv, tables, torch.zeros(20, dtype=torch.long), torch.arange(190, 210))
    assert torch.equal(out[10], batch[0])


def test_write_kv_equals_its_reference_and_skips_rows_without_a_page():
    kv, ref = _pages(3, 64), _pages(3, 64)
    gen = torch.Generator().manual_seed(2)
    qkv = torch.randn(5, 9 * 64 + 2 * 192, generator=gen)
    k, v = qkv[:, 576:768], qkv[:, 768:]
    page, off = torch.tensor([3, -1, 7, 7, -1]), torch.tensor([0, 5, 127, 3, 9])
    pa.write_kv(kv, k, v, page, off)
    pa.write_kv_reference(ref, k, v, page, off)
    assert torch.equal(kv, ref)
    assert torch.equal(kv[7, 0, 127].reshape(-1), k[2]) and torch.equal(kv[7, 1, 3].reshape(-1), v[3])


def test_without_a_compiler_there_is_no_library_and_it_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("DSI_KERNEL_CACHE", str(tmp_path))
    native._build.cache_clear()
    try:
        assert native.library("paged_attention") is None
        assert "paged_attention.c" in native.why_not("paged_attention")
    finally:
        native._build.cache_clear()


def test_rows_written_into_a_range_of_a_larger_result_are_the_batchs():
    kv = _pages(3, 64)
    q, tables, seq, pos = _rows(9, 64, [200, 13, 255, 256, 40, 383])
    batch = pa.paged_attention(q, kv, tables, seq, pos)
    out = torch.full((8, 9 * 64), 7.0)
    got = pa.paged_attention(q[2:5], kv, tables, seq[2:5], pos[2:5], out=out[3:6])
    assert got.data_ptr() == out[3:6].data_ptr() and torch.equal(out[3:6], batch[2:5])
    assert torch.equal(out[:3], torch.full((3, 576), 7.0)) and torch.equal(out[6:], torch.full((2, 576), 7.0))
    with pytest.raises(ValueError, match="out must be"):
        pa.paged_attention(q, kv, tables, seq, pos, out=torch.empty(6, 575))


@pytest.mark.parametrize("threads", [2, 3, 7])
def test_rows_shared_among_threads_have_the_bits_of_one_thread(threads):
    kv = _pages(3, 64)
    pos = [(37 * r) % 380 for r in range(40)]
    q, tables, seq, pos_t = _rows(9, 64, pos)
    pos_t[5] = -1  # a padding row among them
    want = pa.paged_attention(q, kv, tables, seq, pos_t)
    got = pa.paged_attention(q, kv, tables, seq, pos_t, threads=threads)
    assert torch.equal(got, want)
    assert not got[5].any()
