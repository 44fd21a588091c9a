"""The runner's decode rows through the Triton kernels (Triton's interpreter, CPU) give the logits
of its torch path: the dispatch point's CUDA path, checked without a GPU."""

import torch

from dsi.engine.batch import StepSlice
from dsi.engine.device import DecodeKernels
from dsi.engine.runner import ModelRunner
from tests.kernels.interpreted import interpreted


def test_decode_steps_through_the_kernels_match_the_torch_path(tiny):
    da, cp, mg = (interpreted(n) for n in ("decode_attention", "compressor", "moe_gate"))
    cfg, weights = tiny
    kernels = DecodeKernels(da.paged_decode_attention, cp.compress_decode, mg.moe_gate)
    runners = [ModelRunner(cfg, weights, 6, 2, batch_invariant=False, kernels=k) for k in (None, kernels)]
    prompts = [list(range(100, 109)), list(range(300, 304))]  # odd and even lengths: both pair states
    logits = []
    for runner in runners:
        slots = [runner.slots.allocate() for _ in prompts]
        tables = [runner.pool.allocate(1) for _ in prompts]
        steps = [[StepSlice(s, t, 0, p, 0, True) for s, t, p in zip(slots, tables, prompts, strict=True)]]
        for k in range(1):  # one decode token per row: row 0 closes a pair (odd position), row 1 opens one
            steps.append(
                [
                    StepSlice(s, t, len(p) + k, [7 + k], 0, True)
                    for s, t, p in zip(slots, tables, prompts, strict=True)
                ]
            )
        logits.append([runner.forward(step) for step in steps])
    for plain, fused in zip(*logits, strict=True):
        torch.testing.assert_close(fused, plain, rtol=1e-4, atol=1e-4)
    assert runners[1].kernels is kernels
