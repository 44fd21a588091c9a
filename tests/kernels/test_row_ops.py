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
