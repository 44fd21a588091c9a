"""The row-op C kernels against their torch formulas, and the invariance they promise: a row's
result has the same bits alone and in any batch; widths the kernel does not take fall back."""

import pytest
import torch
import torch.nn.functional as F

from dsi.kernels import native, row_ops
from dsi.model.ops import rope_angles, rope_rotate

pytestmark = pytest.mark.skipif(
    row_ops._lib() is None, reason=f"no C kernel here: {native.why_not('row_ops')}"
)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_rms_norm_equals_torch_and_a_row_does_not_depend_on_the_others():
    x = torch.randn(40, 600, generator=_gen(0))[:, :576] * 3  # rows strided
    w = torch.randn(576, generator=_gen(1))
    got = row_ops.rms_norm(x, w, 1e-5)
    assert torch.allclose(got, F.rms_norm(x, (576,), w, 1e-5), atol=1e-5, rtol=1e-5)
    for r in (0, 17, 39):
        assert torch.equal(row_ops.rms_norm(x[r : r + 1], w, 1e-5)[0], got[r])
        assert torch.equal(row_ops.rms_norm(x[r:], w, 1e-5)[0], got[r])


def test_silu_mul_equals_torch_on_both_signs_and_large_inputs():
    gu = torch.randn(33, 3072, generator=_gen(2)) * 8
    gu[0, :4] = torch.tensor([-200.0, 200.0, 0.0, -0.0])
    f = 1536
    want = F.silu(gu[:, :f]) * gu[:, f:]
    got = row_ops.silu_mul(gu)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    assert got[0, 0] == 0.0 and torch.isfinite(got).all()
    assert torch.equal(row_ops.silu_mul(gu[5:6])[0], got[5])


def test_rope_in_place_equals_rope_rotate_and_leaves_v_alone():
    t, hq, hkv, d = 21, 9, 3, 64
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=_gen(3))
    cos, sin = rope_angles(torch.arange(t) * 13, d, 10000.0)
    want = rope_rotate(qkv[:, : (hq + hkv) * d].view(t, hq + hkv, d), cos, sin)
    v = qkv[:, (hq + hkv) * d :].clone()
    got = row_ops.rope_(qkv[:, : (hq + hkv) * d].view(t, hq + hkv, d), cos, sin)
    assert got.data_ptr() == qkv.data_ptr()
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(qkv[:, (hq + hkv) * d :], v)


def test_widths_the_kernel_does_not_take_fall_back_to_torch():
    x = torch.randn(5, 20, generator=_gen(4))
    w = torch.randn(20, generator=_gen(5))
    assert torch.equal(row_ops.rms_norm(x, w, 1e-6), F.rms_norm(x, (20,), w, 1e-6))
    gu = torch.randn(5, 40, generator=_gen(6))
    assert torch.equal(row_ops.silu_mul(gu), F.silu(gu[:, :20]) * gu[:, 20:])
    q = torch.randn(5, 2, 8, generator=_gen(7))
    cos, sin = rope_angles(torch.arange(5), 8, 10000.0)
    want = rope_rotate(q, cos, sin)
    assert torch.allclose(row_ops.rope_(q, cos, sin), want, atol=1e-6)


@pytest.mark.parametrize("threads", [2, 3, 7])
def test_rows_shared_among_threads_have_the_bits_of_one_thread(threads):
    rows = 8 * threads + 5  # every thread gets rows, and the shares are uneven
    x = torch.randn(rows, 600, generator=_gen(8))[:, :576]
    w = torch.randn(576, generator=_gen(9))
    assert torch.equal(row_ops.rms_norm(x, w, 1e-5, threads=threads), row_ops.rms_norm(x, w, 1e-5, threads=1))
    gu = torch.randn(rows, 3072, generator=_gen(10)) * 4
    assert torch.equal(row_ops.silu_mul(gu, threads=threads), row_ops.silu_mul(gu, threads=1))
    hq, hkv, d = 9, 3, 64
    qkv = torch.randn(rows, (hq + 2 * hkv) * d, generator=_gen(11))
    cos, sin = rope_angles(torch.arange(rows) * 7, d, 10000.0)
    one, shared = qkv.clone(), qkv.clone()
    row_ops.rope_(one[:, : (hq + hkv) * d].view(rows, hq + hkv, d), cos, sin, threads=1)
    row_ops.rope_(shared[:, : (hq + hkv) * d].view(rows, hq + hkv, d), cos, sin, threads=threads)
    assert torch.equal(shared, one)
    assert not torch.equal(one, qkv)  # it rotated


def test_out_takes_the_result_and_bad_out_is_refused():
    x = torch.randn(6, 64, generator=_gen(12))
    w = torch.randn(64, generator=_gen(13))
    buf = torch.full((10, 64), 7.0)
    got = row_ops.rms_norm(x, w, 1e-5, out=buf[:6])
    assert got.data_ptr() == buf.data_ptr() and torch.equal(got, row_ops.rms_norm(x, w, 1e-5))
    assert (buf[6:] == 7.0).all()
    gu = torch.randn(6, 128, generator=_gen(14))
    act = torch.empty(6, 64)
    assert row_ops.silu_mul(gu, out=act).data_ptr() == act.data_ptr()
    assert torch.equal(act, row_ops.silu_mul(gu))
    with pytest.raises(ValueError, match="out must be"):
        row_ops.silu_mul(gu, out=torch.empty(6, 65))
