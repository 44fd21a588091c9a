"""The dense runner on a small random Llama: a request's logprobs have the same bits alone,
beside others and with its prompt cut into chunks; the torch attention path (where the C kernel
cannot be built) agrees with the kernel to fp32 rounding."""

import random

import pytest
import torch

from dsi.engine import Engine, EngineConfig, SamplingParams
from dsi.engine.attention_dense import PagedRows, TorchPagedRows, step_rows
from dsi.engine.batch import StepSlice
from dsi.model.llama import LlamaConfig

CFG = LlamaConfig(
    "tiny-llama",
    vocab_size=256,
    hidden=96,
    n_layers=2,
    n_heads=6,
    n_kv_heads=2,
    head_dim=64,
    intermediate=128,
)


@pytest.fixture(scope="module")
def tiny_llama():
    gen = torch.Generator().manual_seed(0)
    h, q, k, f = CFG.hidden, CFG.n_heads * CFG.head_dim, CFG.n_kv_heads * CFG.head_dim, CFG.intermediate
    w = {"embed": torch.randn(CFG.vocab_size, h, generator=gen) * 0.5, "final_norm": torch.ones(h)}
    w["lm_head"] = w["embed"]
    shapes = {
        "wq": (h, q),
        "wk": (h, k),
        "wv": (h, k),
        "wo": (q, h),
        "w_gate": (h, f),
        "w_up": (h, f),
        "w_down": (f, h),
    }
    for i in range(CFG.n_layers):
        w[f"layers.{i}.attn_norm"], w[f"layers.{i}.ffn_norm"] = torch.ones(h), torch.ones(h)
        for name, shape in shapes.items():
            w[f"layers.{i}.{name}"] = torch.randn(*shape, generator=gen) / shape[0] ** 0.5
    return w


def _run(weights, prompts, max_batch_tokens=2048):
    engine = Engine(
        CFG,
        weights,
        EngineConfig(
            num_blocks=16,
            num_slots=4,
            max_running=4,
            max_batch_tokens=max_batch_tokens,
            async_scheduling=False,
        ),
    )
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=True)
    try:
        for i, p in enumerate(prompts):
            engine.add_request(str(i), p, params)
        done = {o.request_id: (o.output, o.logprobs) for o in engine.run_until_done() if o.finished}
    finally:
        engine.close()
    return [done[str(i)] for i in range(len(prompts))]


def test_alone_together_and_chunked_give_the_same_bits(tiny_llama):
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 256) for _ in range(n)] for n in (130, 7, 1)]
    together = _run(tiny_llama, prompts)
    assert together == [_run(tiny_llama, [p])[0] for p in prompts]
    assert together == _run(tiny_llama, prompts, max_batch_tokens=48)


def test_the_torch_path_agrees_with_the_kernel():
    gen = torch.Generator().manual_seed(4)
    kv = torch.randn(8, 2, CFG.block_size, CFG.n_kv_heads, CFG.head_dim, generator=gen)
    batch = [
        StepSlice(slot=0, block_table=[3, 5], start=140, tokens=[1], consumer_start=0, sample=True),
        StepSlice(slot=1, block_table=[2], start=0, tokens=[1] * 9, consumer_start=0, sample=True),
        StepSlice(
            slot=2,
            block_table=[4, 6],
            start=126,
            tokens=[1] * 4,
            consumer_start=0,
            sample=True,
            cached_end=128,
        ),
    ]
    rows = step_rows(batch, CFG.block_size, 16)
    assert rows.page.tolist()[:14] == [5, 2, 2, 2, 2, 2, 2, 2, 2, 2, -1, -1, 6, 6]
    q = torch.randn(16, CFG.n_heads, CFG.head_dim, generator=gen)
    k, v = torch.randn(16, 128, generator=gen), torch.randn(16, 128, generator=gen)
    outs = []
    for path in (PagedRows(), TorchPagedRows(True, CFG.max_context)):
        pages = kv.clone()
        outs.append((path(pages, q, k, v, path.prepare(batch, rows)), pages))
    (native, native_pages), (torch_out, torch_pages) = outs
    assert torch.equal(native_pages, torch_pages)
    assert torch.allclose(native[:14], torch_out[:14], atol=2e-6, rtol=1e-5)
