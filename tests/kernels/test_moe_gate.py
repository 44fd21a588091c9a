"""The Triton fused MoE gate against its torch reference (Triton's interpreter, CPU)."""

import pytest
import torch

from dsi.model.ops import route
from tests.kernels.interpreted import interpreted

mg = interpreted("moe_gate")


def inputs(t=7, h=40, e=12, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(t, h, generator=g).to(dtype), torch.randn(h, e, generator=g).to(dtype)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 1e-3)])
@pytest.mark.parametrize("top_k", [1, 3])
def test_kernel_matches_reference(dtype, tol, top_k):
    x, router = inputs(dtype=dtype)
    w, i = mg.moe_gate(x, router, top_k)
    ref_w, ref_i = mg.moe_gate_reference(x, router, top_k)
    assert w.dtype == torch.float32 and i.dtype == torch.long and w.shape == (7, top_k)
    assert torch.equal(i, ref_i)
    torch.testing.assert_close(w, ref_w, rtol=tol, atol=tol)
    torch.testing.assert_close(w.sum(-1), torch.ones(7))


def test_reference_is_the_models_route():
    x, router = inputs(e=8)
    ref_w, ref_i = mg.moe_gate_reference(x, router, 2)
    w, i = route(x, router, 2, torch.matmul)
    assert torch.equal(ref_i, i)
    torch.testing.assert_close(ref_w, w)


def test_all_experts_and_no_tokens():
    x, router = inputs(e=5)
    w, i = mg.moe_gate(x, router, 5)
    assert sorted(i[0].tolist()) == [0, 1, 2, 3, 4]
    assert (w[:, :-1] >= w[:, 1:]).all()  # largest first
    w, i = mg.moe_gate(x[:0], router, 2)
    assert w.shape == (0, 2) and i.shape == (0, 2)


def test_wrapper_checks_top_k():
    x, router = inputs(e=4)
    with pytest.raises(ValueError, match="top_k"):
        mg.moe_gate(x, router, 5)
