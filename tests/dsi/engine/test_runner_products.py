"""Which products the V4 runner makes: its dense products (attention, compressor, boundary,
logits) through the C product kernel in batch-invariant mode on the CPU, the MoE's through the
tiled products an EP group's expert processes make too; where the kernel is not built, the tiled
products for all."""

import pytest
import torch

from dsi.engine import invariant
from dsi.engine.batch import StepSlice
from dsi.engine.gemm import PackedGemm
from dsi.engine.runner import ModelRunner
from dsi.kernels import dense_gemm, native


def _logits(runner: ModelRunner, prompts: list[list[int]]) -> torch.Tensor:
    slots = [runner.slots.allocate() for _ in prompts]
    tables = [runner.pool.allocate(1) for _ in prompts]
    step = [StepSlice(s, t, 0, p, 0, True) for s, t, p in zip(slots, tables, prompts, strict=True)]
    return runner.forward(step)


@pytest.mark.skipif(not dense_gemm.available(), reason=f"no C kernel here: {native.why_not('dense_gemm')}")
def test_dense_products_go_through_the_c_kernel_and_the_moe_keeps_its_tiles(tiny, monkeypatch):
    cfg, weights = tiny
    runner = ModelRunner(cfg, weights, 6, 2, batch_invariant=True)
    assert isinstance(runner.mm, PackedGemm) and runner.mm.native
    seen = []
    monkeypatch.setattr(invariant, "mm", lambda x, w, tile=invariant.ROW_TILE: seen.append(w) or x @ w)
    prompts = [list(range(100, 109)), list(range(300, 304))]
    got = _logits(runner, prompts)
    moe = {id(t) for name, t in weights.items() if name.rsplit(".", 1)[-1] in ("router", "s1", "s2", "s3")}
    assert seen and all(w.dim() == 2 for w in seen)
    assert any(id(w) in moe for w in seen)  # the router and shared expert: tiled, as in EP
    assert not any(w is runner.w[f"layers.0.{n}"] for w in seen for n in ("wq", "wk", "wv", "wo"))
    plain = _logits(ModelRunner(cfg, weights, 6, 2, batch_invariant=False), prompts)
    torch.testing.assert_close(got, plain, rtol=1e-4, atol=1e-4)


def test_without_the_c_kernel_every_product_is_tiled(tiny, monkeypatch):
    monkeypatch.setattr(dense_gemm, "available", lambda: False)
    cfg, weights = tiny
    assert ModelRunner(cfg, weights, 6, 2, batch_invariant=True).mm is invariant.mm
    assert ModelRunner(cfg, weights, 6, 2, batch_invariant=False).mm is torch.matmul
